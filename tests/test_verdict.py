"""The verdict as a pure function of recorded measurements, one class of situation per test.

The base is a real analyze run on the demo photos (2 workers, eval transform); each test
changes what differs in its situation, as measured on that kind of storage or data."""

import pytest

from dsconvert.analyze.verdict import MEMORY, SOURCE, Measurements, decide


def passes(source=(620.0, 600.0), memory=650.0, **outputs):
    out = {SOURCE: {"cold": source[0], "warm": source[1], "bytes_per_sample": 38_000}}
    if memory is not None:
        out[MEMORY] = {"warm": memory, "bytes_per_sample": 38_000}
    for name, (cold, warm, size, fmt, extra) in outputs.items():
        out[name.replace("__", " --").replace("_", " ")] = dict(
            {"cold": cold, "warm": warm, "bytes_per_sample": size, "format": fmt, "decode": "pil", "options": {}},
            **extra)
    return out


DEMO_OUTPUTS = dict(
    wds=(475.0, 661.0, 39_840, "wds", {}),
    hdf5=(569.0, 653.0, 38_585, "hdf5", {}),
    npy=(883.0, 874.0, 565_431, "npy", {}),
    npy__resize_256=(2794.0, 3035.0, 263_118, "npy", {"options": {"resize": 256}}),
)
DEMO_OUTPUTS["wds,_decode=turbojpeg"] = (980.0, 1010.0, 39_840, "wds", {"decode": "numpy"})


def make(**kw):
    base = dict(
        source="/data/train", storage_kind="local-disk", num_samples=100_000, files_per_sample=1.0,
        mean_sample_bytes=38_000, mean_file_bytes=38_000, cold_latency_ms=0.26, fixed_ms=0.17, bandwidth_mb_s=116.0,
        sweep=[(1, 2600.0), (2, 3100.0), (4, 3500.0), (16, 3400.0)],
        loader=passes(**{k: v for k, v in DEMO_OUTPUTS.items()}),
        decode_ms={"pil": 2.1, "turbojpeg": 1.3}, transform_ms=0.97, cores=2, cache="warm",
        numpy_decoder="turbojpeg", suggested_resize=256, free_bytes=10**12, output_dir="/ssd",
    )
    base.update(kw)
    return Measurements(**base)


def test_decode_bound_recommends_the_fastest_measured_output_that_fits():
    v = decide(make())
    assert v.bottleneck == "decode"
    assert v.recommended == "npy --resize 256"
    assert v.predicted_per_s["npy --resize 256"] == 3035.0  # the measured warm pass, not a model
    assert v.predicted_speedup == pytest.approx(3035 / 600)
    assert v.commands == ["dsconvert shard /data/train --format npy -o /ssd/train-npy --resize 256"]
    # the encoded alternative: the fastest wds pass, with its decoder and size
    assert v.alternative[0].startswith("dsconvert shard /data/train --format wds -o /ssd/train-wds")
    assert 'decode="numpy"' in v.alternative[0] and "1,010/s" in v.alternative[0]
    assert v.per_worker_ms["total"] == pytest.approx(2 / 600 * 1000)
    assert v.read_share == pytest.approx(1 - 600 / 650)


def test_cold_predictions_when_the_data_does_not_fit_in_the_page_cache():
    v = decide(make(cache="cold"))
    assert v.loader_per_s == 620.0 and v.predicted_per_s["wds"] == 475.0 and v.cache == "cold"


def test_disk_budget_excludes_what_does_not_fit():
    v = decide(make(free_bytes=20 * 10**9))  # npy needs 57 GB, resized 26 GB, wds 4 GB
    assert not v.fits["npy"] and not v.fits["npy --resize 256"] and v.fits["wds"]
    assert v.recommended == "wds, decode=turbojpeg"
    assert v.commands[0].startswith("dsconvert shard /data/train --format wds -o /ssd/train-wds")
    outputs = {k: v for k, v in DEMO_OUTPUTS.items() if "turbojpeg" not in k}
    v = decide(make(free_bytes=20 * 10**9, loader=passes(**outputs)))
    assert v.recommended is None and v.bottleneck == "none"  # what fits measured below 1.3x
    assert any("would need" in n for n in v.notes)


def test_storage_latency_is_decided_from_the_sweep_and_the_latency():
    # a FUSE mount adding 8 ms per request: the loader gets a fraction of its from-memory rate,
    # throughput grows with concurrent readers
    v = decide(make(storage_kind="fuse", cold_latency_ms=8.4, fixed_ms=None,
                    sweep=[(1, 110.0), (4, 420.0), (16, 1500.0)],
                    loader=passes(source=(180.0, 182.0), memory=650.0, **DEMO_OUTPUTS)))
    assert v.bottleneck == "storage-latency"
    assert v.read_share > 0.7
    assert v.commands and v.commands[0].startswith("dsconvert shard /data/train --format npy")
    assert "scale 13.6x" in v.evidence[2]
    assert any("local SSD" in n for n in v.notes)


def test_a_latency_mount_type_alone_decides_nothing():
    # NFS by mount type, but the loader runs at its from-memory rate: the CPU is the limit
    v = decide(make(storage_kind="nfs"))
    assert v.bottleneck == "decode"


def test_bandwidth_cap_on_large_files_never_advises_sharding():
    # 32 MB files behind a 150 MB/s cap: flat from 1 to 16 readers, the loader at the cap
    v = decide(make(storage_kind="fuse", mean_sample_bytes=32e6, mean_file_bytes=32e6, cold_latency_ms=215.0,
                    fixed_ms=None, bandwidth_mb_s=150.0, sweep=[(1, 4.6), (4, 4.7), (16, 4.6)],
                    loader=passes(source=(4.5, 4.6), memory=40.0,
                                  wds=(30.0, 31.0, 32e6, "wds", {}), hdf5=(29.0, 30.0, 32e6, "hdf5", {}))))
    assert v.bottleneck == "storage-bandwidth"
    assert not any("--format wds" in c or "--format hdf5" in c for c in v.commands + v.alternative)
    assert any("already large" in n for n in v.notes)
    assert any("local SSD" in n for n in v.notes)


def test_small_files_on_local_disk():
    # 600-byte files without a transform: reading dominates and does not scale with readers
    v = decide(make(mean_sample_bytes=600, mean_file_bytes=600, cold_latency_ms=0.15, fixed_ms=0.12,
                    sweep=[(1, 8000.0), (2, 9000.0)], decode_ms={"pil": 0.02}, transform_ms=0.0, transform="none",
                    loader=passes(source=(3000.0, 3500.0), memory=9000.0,
                                  wds=(8000.0, 8500.0, 1100, "wds", {}))))
    assert v.bottleneck == "small-files"
    assert v.commands == ["dsconvert shard /data/train --format wds -o /ssd/train-wds"]


def test_an_npy_output_is_not_the_bottleneck():
    # a dsconvert npy output measured through open_dataset: nothing to convert to, reading is free
    v = decide(make(kind="dsconvert", convertible=False, decode_ms={}, transform_ms=0.4, mean_sample_bytes=196_608,
                    mean_file_bytes=400e6, bandwidth_mb_s=130.0, sweep=[(1, 0.3), (2, 0.3)],
                    loader={SOURCE: {"cold": 2900.0, "warm": 3000.0, "bytes_per_sample": 196_608}}))
    assert v.bottleneck == "none"
    assert v.commands == [] and v.recommended is None
    assert "not limited by the data's form" in v.summary


def test_npy_arrays_where_no_output_is_faster_is_none():
    v = decide(make(decode_ms={}, transform_ms=0.0, transform="none", mean_file_bytes=600_000,
                    mean_sample_bytes=600_000, loader=passes(source=(2500.0, 2600.0), memory=2700.0,
                                  wds=(2400.0, 2500.0, 600_000, "wds", {}))))
    assert v.bottleneck == "none" and v.commands == []


def test_transform_bound_with_a_target():
    v = decide(make(transform_ms=9.0, decode_ms={"pil": 2.0}, target=5000.0,
                    loader=passes(source=(170.0, 172.0), memory=175.0, wds=(170.0, 171.0, 39_840, "wds", {}))))
    assert v.bottleneck == "transform"
    assert any("GPU" in n and "kornia" in n for n in v.notes)
    assert "short of the 5,000/s target" in v.summary


def test_target_met_means_no_bottleneck():
    v = decide(make(target=500.0))
    assert v.bottleneck == "none" and v.keeps_up is True and "keeps up" in v.summary


def test_without_a_fast_decoder_says_what_to_install():
    outputs = {k: v for k, v in DEMO_OUTPUTS.items() if "turbojpeg" not in k}
    v = decide(make(decode_ms={"pil": 2.1}, numpy_decoder="pil", free_bytes=0, target=10_000.0,
                    loader=passes(**outputs)))
    assert v.bottleneck == "decode" and v.recommended is None
    assert any("libturbojpeg0" in n for n in v.notes)


def test_undetermined_fixed_cost_is_said():
    v = decide(make(fixed_ms=None))
    assert any("not determined" in e for e in v.evidence)


def test_list_source_outputs_are_named_without_the_suffix():
    v = decide(make(source="/data/train.csv", output_dir="/data"))
    assert v.commands == ["dsconvert shard /data/train.csv --format npy -o /data/train-npy --resize 256"]


def test_commands_quote_paths_as_the_shell_and_python_need():
    v = decide(make(source="/data/my images", output_dir="/ssd/it's here"))
    assert v.commands == ["dsconvert shard '/data/my images' --format npy -o '/ssd/it'\"'\"'s here/my images-npy' "
                          "--resize 256"]
    assert "open_dataset(\"/ssd/it's here/my images-wds\", decode=\"numpy\")" in v.alternative[0]


def test_each_output_is_predicted_from_the_pass_its_size_allows():
    # 20 GB of page cache: the source (3.8 GB) stays cached, full-size npy (57 GB) does not
    v = decide(make(cache="auto", page_cache_bytes=20 * 10**9))
    assert v.cache == "warm" and v.loader_per_s == 600.0
    assert v.predicted_per_s["npy"] == 883.0 and v.predicted_per_s["wds"] == 661.0  # npy cold, wds warm
    assert any("npy" in n and "cold pass" in n for n in v.notes)


def test_large_remote_files_get_no_shard_alternative():
    v = decide(make(source="s3://bucket/train", remote=True, storage_kind="s3", mean_sample_bytes=32e6,
                    mean_file_bytes=32e6, cold_latency_ms=215.0, fixed_ms=None, bandwidth_mb_s=150.0,
                    sweep=[(1, 4.6), (4, 4.7), (16, 4.6)], output_dir="/work",
                    loader=passes(source=(4.5, 4.6), memory=40.0, wds=(30.0, 31.0, 32e6, "wds", {}))))
    assert v.bottleneck == "storage-bandwidth"
    assert not any("dsconvert shard" in c for c in v.commands + v.alternative)
    assert any("aws s3 sync" in n for n in v.notes) and not any("rsync -a s3://" in n for n in v.notes)


def test_a_source_that_is_not_convertible_gets_no_command():
    v = decide(make(kind="webdataset", convertible=False))
    assert v.commands == [] and v.alternative == []


def test_an_output_read_warm_at_about_the_disks_speed_is_not_storage_bound():
    # recorded: an npy --resize 256 output on local disk, its one shard read cold at 739 MB/s (the
    # host's cache behind the disk) while the warm loader moved 530 MB/s: the page cache serves it
    v = decide(make(kind="dsconvert", convertible=False, decode_ms={}, transform_ms=0.4, mean_sample_bytes=196_608,
                    mean_file_bytes=236e6, cold_latency_ms=20.0, fixed_ms=None, bandwidth_mb_s=739.0,
                    sweep=[(1, 46.0), (2, 47.0)], loader={SOURCE: {"cold": 2500.0, "warm": 2700.0,
                                                                   "bytes_per_sample": 196_608}}))
    assert v.bottleneck == "none", v.summary
    # the same output where nothing caches (a FUSE mount with caching off): the storage is the limit
    v = decide(make(kind="dsconvert", convertible=False, decode_ms={}, transform_ms=0.4, mean_sample_bytes=196_608,
                    mean_file_bytes=236e6, cold_latency_ms=20.0, fixed_ms=None, bandwidth_mb_s=739.0,
                    page_cache_works=False, sweep=[(1, 46.0), (2, 47.0)],
                    loader={SOURCE: {"cold": 2500.0, "warm": 2700.0, "bytes_per_sample": 196_608}}))
    assert v.bottleneck == "storage-bandwidth", v.summary


def test_reading_an_output_with_another_decoder_needs_no_disk():
    row = {"cold": 900.0, "warm": 950.0, "bytes_per_sample": 39_840, "format": "wds", "decode": "numpy",
           "same_data": True}
    v = decide(make(kind="dsconvert", convertible=False, free_bytes=0,
                    loader={SOURCE: {"cold": 580.0, "warm": 600.0, "bytes_per_sample": 39_840},
                            "decode=turbojpeg": row}))
    assert v.fits["decode=turbojpeg"] and v.recommended == "decode=turbojpeg"
    assert v.commands == ["open_dataset('/data/train', decode=\"numpy\")   # decodes JPEGs with turbojpeg"]


def test_a_fused_and_shrunk_output_is_recommended_with_its_read_line_and_the_loss_said():
    outputs = dict(DEMO_OUTPUTS)
    outputs["wds,_decode=fused"] = (1080.0, 1130.0, 39_840, "wds", {"decode": "fused"})
    outputs["wds__max-size_319,_decode=fused"] = (1530.0, 3300.0, 23_000, "wds",
                                                  {"decode": "fused", "options": {"max_size": 319}})
    v = decide(make(loader=passes(**outputs)))
    assert v.recommended == "wds --max-size 319, decode=fused"
    assert v.commands == ["dsconvert shard /data/train --format wds -o /ssd/train-wds --max-size 319"
                          "   # then open_dataset('/ssd/train-wds', transform=T, decode=\"fused\")"]
    assert any("--max-size 319 re-encodes" in n and "lossy" in n for n in v.notes)
    assert not any("region decoder" in n for n in v.notes)  # built (the default)
    v = decide(make(loader=passes(**outputs), region_decoder=False))
    assert any("region decoder, which is not built here" in n and "libjpeg-dev" in n for n in v.notes)
    assert not any("resize kernel" in n for n in v.notes)
    v = decide(make(loader=passes(**outputs), region_decoder=False, resize_kernel="not built"))
    assert any("region decoder, which is not built" in n and "resize kernel, which is not built" in n
               and "pip install -e ." in n for n in v.notes)
    v = decide(make(loader=passes(**outputs), resize_kernel="no AVX2"))
    assert [n for n in v.notes if "resize kernel" in n] == [
        "decode=\"fused\" resizes with torch here: dsconvert's resize kernel needs an x86-64 CPU with AVX2, which "
        "this is not (the same pixels, slower)"]
    # a recommendation that does not decode fused says nothing about them
    assert not any("region decoder" in n or "resize kernel" in n
                   for n in decide(make(region_decoder=False, resize_kernel="not built")).notes)


def test_candidates_offer_fused_reading_and_max_size_only_where_they_apply(image_folder):
    from dsconvert.analyze.loader import candidates
    from dsconvert.source import scan

    source = scan(image_folder)
    names = [c.name for c in candidates(source, "turbojpeg", 256, fused=True, max_size=341)]
    assert "wds, decode=fused" in names and "wds --max-size 341, decode=fused" in names
    plain = [c.name for c in candidates(source, "turbojpeg", None)]
    assert not any("fused" in n or "max-size" in n for n in plain)


def test_tars_read_in_place_win_over_a_conversion_within_ten_percent():
    """Tar shards another tool wrote: the indexed reader on them as they are is preferred to a
    conversion measured up to 10% faster (no copy, no disk), and its command keeps the label."""
    in_place = {"tars in place, decode=fused": {"cold": 2500.0, "warm": 2800.0, "bytes_per_sample": 39_840,
                                                "format": "wds", "decode": "fused", "same_data": True, "label": "cls"}}
    loader = passes(**DEMO_OUTPUTS)
    loader.update(in_place)
    v = decide(make(source="/data/tars", loader=loader, label="cls", kind="webdataset"))
    assert v.recommended == "tars in place, decode=fused"
    assert v.commands == [
        "open_dataset('/data/tars', label='cls', transform=T, decode=\"fused\")   # reads them in place"]
    loader["tars in place, decode=fused"] = dict(in_place["tars in place, decode=fused"], warm=2000.0)
    v = decide(make(source="/data/tars", loader=loader, label="cls", kind="webdataset"))
    assert v.recommended == "npy --resize 256"  # 3,035/s: more than 10% faster than reading in place
    assert v.commands == ["dsconvert shard /data/tars --format npy --label cls -o /ssd/tars-npy --resize 256"]
