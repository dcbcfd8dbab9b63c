"""analyze on real trees: a slow FUSE mount, large JPEGs on local disk, tiny files."""

import json
import os
import random
import subprocess
import sys

import pytest
from PIL import Image

from dsconvert import convert
from dsconvert.analyze import analyze
from dsconvert.analyze.inventory import quantiles, take_inventory
from dsconvert.analyze.report import render_text
from dsconvert.analyze.sampling import stratified_sample
from dsconvert.cli import main
from dsconvert.units import format_size

from conftest import encode, make_image_folder, write


def test_quantiles_interpolate_like_numpy():
    np = pytest.importorskip("numpy")
    values = [3, 1, 4, 1, 5, 9, 2, 6]
    q = quantiles(values, (0.0, 0.5, 0.9, 0.99, 1.0))
    for key, p in (("p0", 0), ("p50", 50), ("p90", 90), ("p99", 99), ("p100", 100)):
        assert q[key] == pytest.approx(np.percentile(values, p))


def test_inventory_counts_and_layout(tmp_path, photos):
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"a": 5, "b": 3})
    write(os.path.join(root, "a", ".DS_Store"), b"x")
    os.symlink(root, os.path.join(root, "b", "loop"))
    inv = take_inventory(root)
    assert inv.files == 8 and inv.dirs == 3 and inv.complete and inv.layout == "imagefolder"
    assert inv.extensions == {"jpg": 8}
    sizes = sorted(os.path.getsize(os.path.join(root, p)) for p, _ in inv.entries)
    assert inv.bytes == sum(sizes) and inv.size_quantiles["p100"] == sizes[-1]
    assert inv.fanout_quantiles["p100"] == 5 and inv.max_depth == 1


def test_inventory_time_budget_estimates_the_rest(tmp_path):
    root = tmp_path / "many"
    for d in range(30):
        for f in range(10):
            write(str(root / f"d{d:02d}" / f"f{f}.txt"), b"12345")
    inv = take_inventory(str(root), time_budget=0.0, threads=1)
    assert not inv.complete and inv.files < 300
    assert inv.estimated_files >= inv.files and abs(inv.estimated_files - 300) <= 10


def test_inventory_memory_is_bounded_and_its_sample_does_not_depend_on_the_walk(tmp_path, monkeypatch):
    """More files than the inventory keeps: counts, bytes, the size histogram, p0/p100, fan-out
    and files per sample stay exact; the files kept are a hash-chosen sample, the same for one
    thread or eight; only LAYOUT_FOLDERS folders keep a listing. Before: every file's size and
    every folder's listing were held in memory."""
    from collections import Counter

    from dsconvert.analyze import _files_per_sample, inventory

    monkeypatch.setattr(inventory, "LAYOUT_FOLDERS", 2)
    root = tmp_path / "flat"
    sizes = []
    for d in range(5):
        for i in range(30):  # a sample is two files: a .bin and its .json sidecar
            for ext, size in (("bin", 100 + 37 * i + d), ("json", 10 + i % 7)):
                write(str(root / f"d{d}" / f"s{i:03d}.{ext}"), b"x" * size)
                sizes.append(size)
    one = inventory.take_inventory(str(root), keep_entries=50, threads=1)
    many = inventory.take_inventory(str(root), keep_entries=50, threads=8)
    assert one.entries == many.entries and len(one.entries) == 50 and one.sampled
    assert one.files == 300 and one.bytes == sum(sizes) and one.stems == 150
    assert _files_per_sample(one) == 2.0
    bins = Counter(max(0, s - 1).bit_length() for s in sizes)
    assert one.size_histogram == [{"le": 1 << k, "count": bins[k]} for k in sorted(bins)]
    assert one.size_quantiles["p0"] == min(sizes) and one.size_quantiles["p100"] == max(sizes)
    assert one.fanout_quantiles == quantiles([0, 60, 60, 60, 60, 60])  # the root holds no file
    assert [d.rel for d in one.listings] == ["", "d0"] and one.folders == ["", "d0", "d1", "d2", "d3", "d4"]
    # the sample's source is built from its folders listed again: a picked file brings its sidecar
    from dsconvert.analyze.loader import sample_source

    picked = [p for p, _ in one.entries if p.endswith(".bin")][:3]
    source = sample_source(str(root), inventory.listings_for(one, picked), picked, "flat")
    assert sorted(len(s.files) for s in source.samples) == [2, 2, 2]


def test_counts_past_the_listing_cap_come_from_the_inventory(tmp_path, monkeypatch):
    """A folder larger than detect's listing cap: the description says the cap as a cap and
    gives the whole folder's totals from the inventory. Before: the listed count stood alone."""
    import numpy as np

    from dsconvert.analyze import _detected_dict
    from dsconvert.analyze.detect import detect, limits

    monkeypatch.setattr(limits, "MAX_ENTRIES", 10)
    for i in range(30):
        np.save(tmp_path / f"{i:03d}.npy", np.zeros(3, np.uint8))
    found, inv = detect(str(tmp_path)), take_inventory(str(tmp_path))
    d = _detected_dict(found, inv)
    assert d["files"] == 30 and d["files_listed"] == 10
    assert "the listing stops at 10 entries (a cap)" in d["description"]
    assert d["description"].endswith(f"the whole folder holds 30 files, {format_size(inv.bytes)} (the inventory)")


def test_the_sweep_is_repeated_and_keeps_every_rounds_rate(tmp_path):
    """Storage rates are wall rates: each level is read in at least two interleaved rounds, its
    row is the median round, and every round's rate stays beside it (the spread is known)."""
    from dsconvert.analyze.measure import concurrency_sweep

    paths = [str(tmp_path / f"f{i}.bin") for i in range(24)]
    for p in paths:
        write(p, b"x" * 4096)
    rows = concurrency_sweep(paths, [1, 4], rounds=(2, 3))
    assert [r["readers"] for r in rows] == [1, 4]
    for r in rows:
        assert 2 <= len(r["files_per_s_runs"]) <= 3 and len(r["mb_per_s_runs"]) == len(r["files_per_s_runs"])
        assert r["files_per_s"] in r["files_per_s_runs"] and r["files"] == 24


def test_stratified_sample_is_seeded_and_covers_strata():
    entries = [(f"c{c}/f{i}.jpg", (i % 40) * 1000 + c) for c in range(5) for i in range(200)]
    a = stratified_sample(entries, 40, seed=1)
    assert a == stratified_sample(entries, 40, seed=1) != stratified_sample(entries, 40, seed=2)
    assert len(a) == 40
    assert {p.split("/")[0] for p, _ in a} == {f"c{c}" for c in range(5)}
    sizes = sorted(s for _, s in entries)
    small = sum(1 for _, s in a if s <= sizes[len(sizes) // 4])
    assert 5 <= small <= 15  # about a quarter from the smallest size quartile
    assert stratified_sample(entries[:10], 40) == sorted(entries[:10])


@pytest.mark.slow
@pytest.mark.system
@pytest.mark.parametrize("slow_mount", [4], indirect=True)
def test_slow_mount_is_storage_latency(slow_mount, photos):
    backing, mnt = slow_mount
    make_image_folder(str(backing / "src"), photos, {"a": 30, "b": 30}, size=(64, 48))
    report = analyze(str(mnt / "src"), sample=40, sweep_levels=[1, 4, 8])
    v = report["verdict"]
    assert report["storage"]["kind"] == "fuse" and report["storage"]["latency_bound"]
    assert v["bottleneck"] == "storage-latency", v["summary"]
    assert report["read"]["cold_sequential"]["latency_ms"]["p50"] >= 8  # 4 ms in open + 4 ms in read
    sweep = {r["readers"]: r["files_per_s"] for r in report["sweep"]}
    assert sweep[8] > 3 * sweep[1]  # parallel readers hide latency
    assert v["commands"][0].startswith(f"dsconvert shard {mnt / 'src'} --format ")
    assert v["read_share"] >= 0.5
    assert v["predicted_speedup"] > 2  # measured: the outputs are written to local disk


@pytest.mark.slow
def test_large_jpegs_on_local_disk_are_decode_bound(tmp_path, photos):
    root = tmp_path / "big"
    rng = random.Random(0)
    names = list(photos)
    for i in range(12):
        img = photos[names[i % len(names)]].convert("RGB").resize((2400, 1800), Image.Resampling.BICUBIC)
        write(str(root / f"c{i % 2}" / f"{i}.jpg"), encode(img, quality=rng.randint(95, 98)))
    report = analyze(str(root), sample=12, sweep_levels=[1, 2], pass_seconds=2)
    v = report["verdict"]
    assert v["bottleneck"] == "decode", v["summary"]
    assert v["per_worker_ms"]["decode"] > v["per_worker_ms"]["read"] + v["per_worker_ms"]["overhead"]
    jpeg = report["decode"]["per_codec"]["jpeg"]
    assert "pil" in jpeg and jpeg["pil"]["mp_per_s"] > 0
    assert report["decode"]["images"]["width"]["p50"] == 2400
    assert report["verdict"]["recommended"] is not None


@pytest.mark.slow
def test_tiny_files_are_per_file_overhead_bound(tmp_path):
    root = tmp_path / "tiny"
    rng = random.Random(0)
    for i in range(400):  # per-sample records of 600 bytes, no decode: only the per-file cost is left
        write(str(root / f"part{i % 4}" / f"{i:05d}.bin"), bytes(rng.getrandbits(8) for _ in range(600)))
    # read cold (a dataset too large for the page cache): per-file reads dominate
    report = analyze(str(root), sample=400, sweep_levels=[1, 2], transform="none", cache="cold")
    v = report["verdict"]
    assert v["bottleneck"] == "small-files", (v["summary"], v["per_worker_ms"])
    assert report["inventory"]["size_quantiles"]["p50"] < 1000
    assert v["commands"] and v["commands"][0].startswith(f"dsconvert shard {root} --format ")
    assert "npy" not in v["predicted_per_s"]  # dict samples: npy holds (image, label) only


@pytest.mark.slow
def test_cli_text_and_json(tmp_path, image_folder, capsys):
    assert main(["analyze", image_folder, "--json", "--sample", "16", "--target", "10"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["schema"] == "dsconvert.analyze" and report["schema_version"] == 2
    assert report["sample"]["files"] == 16 and report["inventory"]["files"] == 16
    assert report["verdict"]["keeps_up"] is True and report["verdict"]["bottleneck"] == "none"
    assert main(["analyze", image_folder, "-q", "--sample", "8"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"dsconvert analyze {image_folder}") and "verdict:" in text
    assert "\033[" not in text  # no colour when stdout is not a tty
    assert "\033[" in render_text(report, tty=True)
    assert main(["analyze", str(tmp_path / "nope")]) == 1


@pytest.mark.slow
def test_npy_load_measured_and_pickles_never_loaded(tmp_path):
    import pickle

    np = pytest.importorskip("numpy")
    root = tmp_path / "arrays"
    for i in range(6):
        buf = __import__("io").BytesIO()
        np.save(buf, np.arange(100 * i, dtype=np.float32))
        write(str(root / f"{i}.npy"), buf.getvalue())
    marker = tmp_path / "executed"
    # a pickle that would create a file if anyone unpickled it
    evil = pickle.dumps(type("Boom", (), {"__reduce__": lambda self: (open, (str(marker), "w"))})())
    write(str(root / "x.pkl"), evil)
    report = analyze(str(root), sweep_levels=[1])
    assert report["decode"]["npy_load_ms"] > 0
    assert "not measured" in report["decode"]["pickle"]
    assert not marker.exists()


@pytest.mark.slow
@pytest.mark.system
@pytest.mark.parametrize("slow_mount", [(0.5, 16)], indirect=True)
def test_large_files_behind_a_bandwidth_cap_are_bandwidth_bound(slow_mount, photos):
    """Shards of 7 MB behind a link of 16 MB/s for all readers together: flat with readers, and
    already large, so the fix is faster storage, never sharding them again."""
    backing, mnt = slow_mount
    src = backing / "src"
    noise = __import__("numpy").random.default_rng(0)
    for i in range(32):  # noise compresses badly: ~0.6 MB a JPEG, 16 to a shard
        pixels = noise.integers(0, 256, (600, 800, 3), dtype="uint8")
        write(str(src / f"c{i % 2}" / f"{i:03d}.jpg"), encode(Image.fromarray(pixels), quality=90))
    convert(str(src), str(backing / "wds"), "wds", samples_per_shard=16, verify=False)
    report = analyze(str(mnt / "wds"), sample=16, sweep_levels=[1, 4], cache="cold", pass_seconds=2)
    v = report["verdict"]
    assert report["detected"]["kind"] == "dsconvert" and report["detected"]["format"] == "wds"
    assert report["measurements"]["mean_file_bytes"] >= 4e6
    sweep = {r["readers"]: r["mb_per_s"] for r in report["sweep"]}
    assert sweep[4] < 1.5 * sweep[1] <= 1.5 * 17  # flat, at the cap
    assert v["bottleneck"] == "storage-bandwidth", (v["summary"], v["evidence"])
    assert not any("dsconvert shard" in c for c in v["commands"] + v["alternative"])
    assert any("already large" in n for n in v["notes"]) and any("dsconvert cache" in n for n in v["notes"])


@pytest.mark.slow
@pytest.mark.parametrize("fmt,options", [("wds", {}), ("hdf5", {}), ("hdf5", {"decode": True}),
                                         ("npy", {"resize": 32})])
def test_outputs_are_recognised_and_read_through_open_dataset(tmp_path, photos, fmt, options):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 40, "b": 40}, size=(64, 48))
    out = tmp_path / "out"
    convert(src, str(out), fmt, verify=False, **options)
    report = analyze(str(out), sample=64, sweep_levels=[1, 2], pass_seconds=2)
    v = report["verdict"]
    assert report["detected"]["kind"] == "dsconvert" and report["detected"]["format"] == fmt
    assert report["measurements"]["num_samples"] == 80  # from the manifest, not the files
    passes = report["loader"]["passes"]
    assert passes["source"]["warm"] > 0 and passes["source"]["format"] == fmt
    assert passes["source"]["warm_cpu_ms"] > 0  # the workers' CPU per sample, what predictions rest on
    assert not any(c.startswith("dsconvert shard") for c in v["commands"] + v["alternative"])
    # what limits it is a CPU stage, never the storage, and no fix says "convert it again"
    assert v["bottleneck"] in ("decode", "transform", "collate-ipc"), v["summary"]


def test_formats_dsconvert_does_not_read_are_named_not_measured(tmp_path):
    import h5py

    np = pytest.importorskip("numpy")
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f["images"] = np.zeros((50, 16, 16, 3), np.uint8)
    report = analyze(str(path), sweep_levels=[1])
    v = report["verdict"]
    assert report["detected"]["kind"] == "hdf5"
    assert v["bottleneck"] == "unknown" and "HDF5" in v["summary"] and v["commands"] == []
    assert report["loader"]["passes"] == {}


def test_scratch_folders_of_a_killed_analyze_are_removed_by_the_next(tmp_path):
    from dsconvert.analyze.loader import SCRATCH_PREFIX, remove_abandoned

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{SCRATCH_PREFIX}{dead.pid}-abc" / "npy-0").mkdir(parents=True)  # its process is gone
    (tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def").mkdir()  # a running analyze's (ours)
    (tmp_path / f"{SCRATCH_PREFIX}notapid").mkdir()  # not one of ours: left alone
    (tmp_path / "data").mkdir()
    assert remove_abandoned(str(tmp_path)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{SCRATCH_PREFIX}{os.getpid()}-def", f"{SCRATCH_PREFIX}notapid", "data"])
    assert remove_abandoned(str(tmp_path / "missing")) == 0


@pytest.mark.slow
def test_paired_rounds_measure_each_output_beside_the_data_as_it_is(tmp_path, photos, monkeypatch):
    """The predicted gain comes from rounds: the data as it is, every output, the data as it
    is again; each output's row keeps one pass a round and the data as it is one more."""
    root = tmp_path / "src"
    for i, name in enumerate(sorted(photos)[:8]):
        write(str(root / f"c{i % 2}" / f"{i}.jpg"), encode(photos[name].convert("RGB"), quality=90))
    monkeypatch.setenv("DSCONVERT_ANALYZE_ROUNDS", "2")
    report = analyze(str(root), sample=8, sweep_levels=[1], pass_seconds=0.5)
    passes = report["loader"]["passes"]
    from dsconvert.analyze.verdict import SOURCE

    outputs = [name for name in passes if name != SOURCE and "warm_rounds" in passes[name]]
    assert outputs, passes.keys()
    assert len(passes[SOURCE]["warm_rounds"]) == 3
    for name in outputs:
        assert len(passes[name]["warm_rounds"]) == 2
        assert all(r["cpu_ms"] > 0 for r in passes[name]["warm_rounds"])


def test_the_paired_rounds_setting_is_read_or_refused_in_one_line(monkeypatch):
    from dsconvert.analyze.loader import ROUNDS, round_bounds

    monkeypatch.delenv("DSCONVERT_ANALYZE_ROUNDS")
    assert round_bounds() == ROUNDS
    for text, bounds in (("0", (0, 0)), ("2", (2, 2)), ("1,4", (1, 4)), (" 3 ", (3, 3))):
        monkeypatch.setenv("DSCONVERT_ANALYZE_ROUNDS", text)
        assert round_bounds() == bounds
    for text in ("x", "-1", "3,1", "1,2,3"):
        monkeypatch.setenv("DSCONVERT_ANALYZE_ROUNDS", text)
        with pytest.raises(ValueError, match="DSCONVERT_ANALYZE_ROUNDS"):
            round_bounds()
