"""The verdict as a pure function of constructed measurements."""

import pytest

from dsconvert.analyze.verdict import Measurements, decide


def make(**kw):
    base = dict(
        source="/data/train", storage_kind="local-disk", latency_bound_storage=False, num_samples=100_000,
        files_per_sample=1.0, mean_sample_bytes=110_000, fixed_ms=0.1, bandwidth_mb_s=500.0,
        sweep=[(1, 4000.0), (2, 4300.0), (4, 4400.0)], prep_only_per_s=800.0, fetch_only_per_s=4000.0,
        both_per_s=700.0, decode_ms={"pil": 1.25, "turbojpeg": 0.68}, cores=4, numpy_decoder="turbojpeg",
        decoded_bytes_per_sample=500 * 375 * 3, resized_bytes_per_sample=341 * 256 * 3, suggested_resize=256,
        memory_bandwidth_mb_s=8000.0, free_bytes=10**12, output_dir="/ssd",
    )
    base.update(kw)
    return Measurements(**base)


def test_decode_bound_recommends_the_fastest_fitting_output():
    v = decide(make())
    assert v.bottleneck == "decode"
    assert v.per_worker_ms["decode"] == pytest.approx(1.25)
    assert v.per_worker_ms["total"] == pytest.approx(1000 / 700)
    assert v.recommended == "npy --resize 256"
    assert v.commands[0] == "dsconvert shard /data/train --format npy -o /ssd/train-npy --resize 256"
    assert v.commands == ["dsconvert shard /data/train --format npy -o /ssd/train-npy --resize 256"]
    assert v.alternative == ["dsconvert shard /data/train --format wds -o /ssd/train-wds",
                             'open_dataset("/ssd/train-wds", decode="numpy")  # decodes JPEGs with turbojpeg']
    assert v.predicted_speedup == pytest.approx(v.predicted_per_s["npy --resize 256"] / v.loader_per_s)
    # 4 workers, decode-bound: 4 x 700 = 2,800/s, below the storage rate and the 4 x 800 CPU limit
    assert v.loader_per_s == pytest.approx(2800)


def test_disk_budget_excludes_what_does_not_fit():
    v = decide(make(free_bytes=20 * 10**9))  # npy needs 56 GB, resized 26 GB, wds 11 GB
    assert not v.fits["npy"] and not v.fits["npy --resize 256"] and v.fits["wds"]
    assert v.recommended == "wds+turbojpeg"
    assert v.commands == ["dsconvert shard /data/train --format wds -o /ssd/train-wds",
                          'open_dataset("/ssd/train-wds", decode="numpy")  # decodes JPEGs with turbojpeg']
    assert any("would need" in n for n in v.notes)


def test_storage_latency():
    v = decide(make(storage_kind="nfs", latency_bound_storage=True, fixed_ms=8.0, fetch_only_per_s=110.0,
                    both_per_s=100.0, sweep=[(1, 110.0), (4, 420.0), (16, 1500.0)]))
    assert v.bottleneck == "storage-latency"
    assert v.commands[0] == "dsconvert shard /data/train --format wds -o /ssd/train-wds"
    assert "scale 13.6x" in v.evidence[1] and "latency-bound" in v.evidence[1]
    assert v.predicted_speedup > 5
    assert any("local SSD" in n for n in v.notes)


def test_small_files_on_local_disk():
    v = decide(make(mean_sample_bytes=600, fixed_ms=0.12, fetch_only_per_s=8000.0, prep_only_per_s=40000.0,
                    both_per_s=7000.0, decode_ms={"pil": 0.025}, numpy_decoder="pil",
                    decoded_bytes_per_sample=16 * 16 * 3, suggested_resize=None, resized_bytes_per_sample=0))
    assert v.bottleneck == "small-files"
    # the whole read stall (1/7000 - 1/40000 s) is per-file overhead: the fixed cost exceeds it
    assert v.per_worker_ms["overhead"] == pytest.approx(1000 / 7000 - 1000 / 40000)
    assert v.per_worker_ms["read"] == pytest.approx(0.0)
    assert v.commands[0].startswith("dsconvert shard /data/train --format wds")


def test_bandwidth_bound_large_files():
    v = decide(make(mean_sample_bytes=20e6, fixed_ms=0.2, bandwidth_mb_s=200.0, fetch_only_per_s=10.0,
                    prep_only_per_s=500.0, both_per_s=9.8))
    assert v.bottleneck == "storage-bandwidth"


def test_target_met_means_no_bottleneck():
    v = decide(make(target=1000.0))
    assert v.bottleneck == "none" and v.keeps_up is True
    assert "keeps up" in v.summary
    short = decide(make(target=100000.0))
    assert short.keeps_up is False and "short of the 100,000/s target" in short.summary


def test_without_a_fast_decoder_says_what_to_install():
    v = decide(make(decode_ms={"pil": 1.25}, numpy_decoder="pil", free_bytes=0))
    assert v.bottleneck == "decode" and v.recommended is None
    assert any("libturbojpeg0" in n for n in v.notes)
