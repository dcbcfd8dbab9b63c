"""dsconvert bench: real DataLoader passes over a source and its conversions."""

import json
import os

import pytest

from dsconvert import convert
from dsconvert.bench import CropToTensor, bench, default_worker_counts, render_text
from dsconvert.cli import main
from dsconvert.errors import OptionError

from conftest import write


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, photos):
    from conftest import make_image_folder

    tmp = tmp_path_factory.mktemp("bench")
    src = str(tmp / "src")
    make_image_folder(src, photos, {"a": 20, "b": 15}, size=(80, 60))
    wds, npy = str(tmp / "wds"), str(tmp / "npy")
    convert(src, wds, samples_per_shard=10, workers=1)
    convert(src, npy, "npy", workers=1)
    return src, wds, npy


@pytest.mark.slow
def test_before_and_after_in_one_run(outputs, torch):
    src, wds, npy = outputs
    report = bench([src, wds, npy], workers=[0, 2], batch_sizes=[8], size=32, max_samples=24)
    assert report["schema"] == "dsconvert.bench" and report["schema_version"] == 1
    kinds = [d["kind"] for d in report["datasets"]]
    assert kinds == ["source", "wds", "npy"]
    assert [d["num_samples"] for d in report["datasets"]] == [35, 35, 35]
    assert report["datasets"][0]["files"] == 24  # the subset's files are what a cold pass evicts
    runs = report["runs"]
    assert len(runs) == 2 * 3 * 2  # workers x datasets x (cold, warm)
    for r in runs:
        assert r["samples"] == 24 and r["samples_per_s"] > 0 and r["mb_per_s"] > 0
        assert r["wait_ms"]["p50"] >= 0 and r["startup_s"] >= 0
        assert (r["worker_cpu_pct"] is None) == (r["workers"] == 0)
        if r["dataset"] == report["datasets"][0]["path"]:
            assert r["vs_first"] == pytest.approx(1.0)
    assert {r["cache"] for r in runs} == {"cold", "warm"}
    text = render_text(report)
    assert "src (source)" in text and "npy (npy)" in text and "fastest:" in text


@pytest.mark.slow
def test_cli_json_and_raw_mode(outputs, capsys, torch):
    src, wds, _ = outputs
    assert main(["bench", src, wds, "--workers", "1", "--batch-size", "5,10", "--decode", "raw", "--size", "0",
                 "--max-samples", "20", "--cache", "warm", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["settings"]["batch_sizes"] == [5, 10] and report["settings"]["caches"] == ["warm"]
    assert {(r["batch_size"], r["samples"]) for r in report["runs"]} == {(5, 20), (10, 20)}


def test_crop_transform_gives_uint8_chw(photos, torch):
    import numpy as np

    t = CropToTensor(48)
    img = photos["astronaut"].resize((100, 60))
    for x in (img, np.asarray(img), img.convert("L")):
        out = t(x)
        assert out.dtype == torch.uint8 and out.shape[1:] == (48, 48)


def test_bad_options(outputs, tmp_path, torch):  # bench() needs torch before it checks options
    src, _, _ = outputs
    with pytest.raises(OptionError):
        bench([src], workers=[-1])
    with pytest.raises(OptionError):
        bench([src], caches=["lukewarm"])
    flat = str(tmp_path / "flat")
    write(os.path.join(flat, "a.jpg"), open(os.path.join(src, "a", "a_0000.jpg"), "rb").read())
    write(os.path.join(flat, "a.json"), b"{}")
    with pytest.raises(OptionError, match="--transform none"):
        bench([flat], workers=[0], max_samples=1)


def test_default_worker_counts():
    assert default_worker_counts(2) == [0, 1, 2] and default_worker_counts(6) == [0, 1, 2, 4, 6]


class _Burns:
    """Each sample costs 2 ms of its worker's CPU; each worker's first sample 100 ms more (a
    start-up: imports, caches)."""

    def __init__(self):
        self.started = False

    def __len__(self):
        return 48

    def __getitem__(self, i):
        import time

        burn = 0.002 + (0.1 if not self.started else 0.0)
        self.started = True
        t = time.process_time()
        while time.process_time() - t < burn:
            pass
        return i


def test_batch_clocks_count_whole_batches_and_leave_each_workers_start_up_out():
    """The workers' CPU per sample from their own clocks at the end of each batch: 2 ms a sample
    (and a little for collating and sending), the 100 ms first samples left out; measured from
    the main process over the whole pass they would add 200 ms / 48 samples (4 ms a sample)."""
    from torch.utils.data import DataLoader

    from dsconvert.bench import BatchClocks, cpu_ms_per_sample, median_batch_ms

    clocks = BatchClocks(list, 2, 6)
    got = [i for batch in DataLoader(_Burns(), batch_size=8, num_workers=2, collate_fn=clocks) for i in batch]
    assert sorted(got) == list(range(48))
    batches = clocks.batches()
    assert len(batches) == 4 and sum(n for _, n in batches) == 32  # 3 batches per worker, the first left out
    assert 2.0 <= cpu_ms_per_sample(batches) < 3.0
    assert 2.0 <= median_batch_ms(batches) < 3.0
