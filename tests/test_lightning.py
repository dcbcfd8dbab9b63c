"""Lightning: the DataLoadingCallback in a real Trainer, and a real fit stopped mid-epoch by a
crash and resumed with ckpt_path= (examples/lightning_resume.py) seeing every sample once."""

import json
import os
import subprocess
import sys
import time

import pytest

from dsconvert import convert

from conftest import make_image_folder

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("torchdata.stateful_dataloader")
torch = pytest.importorskip("torch")

EXAMPLE = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "lightning_resume.py")


@pytest.fixture(scope="module")
def wds_out(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("lightning")
    make_image_folder(str(root / "src"), photos, {"a": 27, "b": 23}, size=(24, 16))
    convert(str(root / "src"), str(root / "wds"), samples_per_shard=8, workers=1)
    return str(root / "wds")


def _run(wds_out, work, *extra):
    done = subprocess.run([sys.executable, EXAMPLE, wds_out, work, "--epochs", "2", *extra], capture_output=True,
                          text=True, timeout=300)
    return done, [json.loads(line) for line in open(os.path.join(work, "seen.jsonl"))]


@pytest.fixture(scope="module")
def uninterrupted(wds_out, tmp_path_factory):
    done, whole = _run(wds_out, str(tmp_path_factory.mktemp("whole")))
    assert done.returncode == 0, done.stderr[-2000:]
    return whole


def test_a_crashed_fit_resumes_and_reads_what_an_uninterrupted_one_reads(wds_out, tmp_path, uninterrupted):
    """examples/lightning_resume.py, 2 epochs of 13 steps: killed before step 5 (mid-epoch),
    resumed with ckpt_path= and killed again before step 13 (its checkpoint was taken at the
    first epoch's last step), resumed again: the three runs together read exactly the
    uninterrupted run's steps (each epoch every sample once, each epoch in its own order)."""
    whole = uninterrupted
    assert [r["step"] for r in whole] == list(range(26)) and [r["epoch"] for r in whole] == [0] * 13 + [1] * 13
    epochs = [[i for r in whole if r["epoch"] == e for i in r["ids"]] for e in (0, 1)]
    assert len(set(epochs[0])) == 50 and sorted(epochs[0]) == sorted(epochs[1]) and epochs[0] != epochs[1]

    work = str(tmp_path / "crashed")
    for crash in (5, 13):
        crashed, seen = _run(wds_out, work, "--crash-at", str(crash))
        assert crashed.returncode != 0 and f"preempted before step {crash}" in crashed.stderr
        assert [r["step"] for r in seen] == list(range(crash))
    resumed, both = _run(wds_out, work)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "Restored all states from the checkpoint" in resumed.stdout + resumed.stderr
    assert both == whole


class _Slow:
    """A transform that takes ``seconds`` per sample: loading dominates the step."""

    def __init__(self, seconds):
        self.seconds = seconds

    def __call__(self, raw):
        time.sleep(self.seconds)
        return torch.tensor([len(raw) / 1e4])


class _Model(pl.LightningModule):
    def __init__(self, compute_s):
        super().__init__()
        self.layer = torch.nn.Linear(1, 2)
        self.compute_s = compute_s

    def training_step(self, batch, batch_idx):
        time.sleep(self.compute_s)
        features, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("load_s, compute_s, bound", [(0.01, 0.0, "input-bound"), (0.0, 0.03, "compute-bound")])
def test_the_callback_logs_load_and_compute_and_alerts_when_input_bound(wds_out, tmp_path, load_s, compute_s, bound):
    from dsconvert import DataLoadingMonitor, open_dataset
    from dsconvert.lightning import DataLoadingCallback

    ds = open_dataset(wds_out, transform=_Slow(load_s), decode="raw", batch_size=5)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    callback = DataLoadingCallback(DataLoadingMonitor(window=10, patience=3, warmup=1), log_every_n_steps=2)
    logger = pl.loggers.CSVLogger(str(tmp_path), name="run")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", callbacks=[callback], logger=logger, log_every_n_steps=1,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(_Model(compute_s), loader)
    summary = callback.monitor.summary()
    assert callback.monitor.steps == 10 and summary["verdict"] == bound
    assert (summary["alerts"] >= 1) == (bound == "input-bound")
    assert "data/load_share" in trainer.progress_bar_metrics
    metrics = open(os.path.join(logger.log_dir, "metrics.csv")).read().splitlines()
    header = metrics[0].split(",")
    for name in ("data/load_share", "data/load_ms", "data/load_p99_ms", "data/compute_ms", "data/alerts"):
        assert name in header
    shares = [float(row.split(",")[header.index("data/load_share")]) for row in metrics[1:]
              if row.split(",")[header.index("data/load_share")]]
    assert len(shares) >= 4 and all((s > 0.5) == (bound == "input-bound") for s in shares)
