"""Lightning: the DataLoadingCallback in a real Trainer, and a real fit stopped mid-epoch by a
crash and resumed with ckpt_path= (examples/lightning_resume.py) seeing every sample once."""

import contextlib
import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
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


@pytest.mark.slow
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
    """A one-layer model whose step takes at least ``compute_s`` (a sleep), or plays the
    recorded compute of each step on ``clock``."""

    def __init__(self, compute_s=0.0, clock=None, computes=()):
        super().__init__()
        self.layer = torch.nn.Linear(1, 2)
        self.compute_s, self.clock, self.computes = compute_s, clock, list(computes)

    def training_step(self, batch, batch_idx):
        if self.clock is not None:
            self.clock.now += self.computes[batch_idx]
        else:
            time.sleep(self.compute_s)
        features, labels = batch
        return torch.nn.functional.cross_entropy(self.layer(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback, model, loader, tmp_path):
    logger = pl.loggers.CSVLogger(str(tmp_path), name="run")
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", callbacks=[callback], logger=logger, log_every_n_steps=1,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, loader)
    rows = open(os.path.join(logger.log_dir, "metrics.csv")).read().splitlines()
    header = rows[0].split(",")
    metrics = [dict(zip(header, row.split(","))) for row in rows[1:]]
    return trainer, header, metrics


def _logged_shares(metrics, every=2):
    """data/load_share as the callback logged it every ``every`` steps (the CSV repeats the last
    value on the steps between: the trainer writes its metrics every step)."""
    by_step = {int(m["step"]): float(m["data/load_share"]) for m in metrics if m.get("data/load_share")}
    return [by_step[k] for k in sorted(by_step) if (k + 1) % every == 0]


def test_the_callback_logs_load_and_compute_in_a_real_fit(wds_out, tmp_path):
    """The wiring, on the real clock: a dsconvert dataset whose transform sleeps, a real
    Trainer, a CSV logger. No threshold is asserted here: which side of 0.5 a live step falls
    on is the machine's load (the decision is tested below, on recorded steps)."""
    from dsconvert import DataLoadingMonitor, open_dataset
    from dsconvert.lightning import DataLoadingCallback

    ds = open_dataset(wds_out, transform=_Slow(0.01), decode="raw", batch_size=5)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=0)
    callback = DataLoadingCallback(DataLoadingMonitor(window=10, patience=3, warmup=1), log_every_n_steps=2)
    trainer, header, metrics = _fit(callback, _Model(0.0), loader, tmp_path)
    monitor = callback.monitor
    assert monitor.steps == 10 and monitor.summary()["window"] == 9
    # every sample's sleep happened inside a wait for a batch (a sleep is never shorter)
    assert monitor.startup_s + monitor.total_load_s >= 50 * 0.01
    assert "data/load_share" in trainer.progress_bar_metrics
    for name in ("data/load_share", "data/load_ms", "data/load_p99_ms", "data/compute_ms", "data/alerts"):
        assert name in header
    shares = _logged_shares(metrics)
    assert len(shares) == 5 and all(0.0 <= s <= 1.0 for s in shares)


class _Clock:
    """Time as a recording plays it: the callback reads it, the data and the model advance it."""

    now = 0.0

    def __call__(self):
        return self.now


class _RecordedWaits(torch.utils.data.Dataset):
    """Batch k of a recorded run, whose fetch takes the recorded wait of step k on ``clock``
    (a sized map-style source: Lightning fetches each batch in its own step's wait)."""

    def __init__(self, clock, loads):
        self.clock, self.loads = clock, loads

    def __len__(self):
        return len(self.loads)

    def __getitem__(self, k):
        self.clock.now += self.loads[k]
        return torch.tensor([[float(k)]]), torch.tensor([k % 2])


# (load ms, compute ms) of each of the 10 steps of real fits of the test above (a 0 to 10 ms
# sleep per sample, 5 samples a batch, a 0 or 30 ms training step) on a 2-core machine running
# the test suite beside them: the first step (warm-up, left out) then the 9 in the window.
RECORDED = {
    # 10 ms a sample: input-bound, by far
    "input-bound": [(56.86, 0.0), (52.54, 2.01), (52.2, 3.18), (52.77, 37.95), (52.26, 9.03), (52.2, 22.99),
                    (53.1, 30.28), (52.26, 20.05), (52.7, 31.41), (52.82, 23.63)],
    # a 30 ms step and no sleep in the data: compute-bound, by far
    "compute-bound": [(1.73, 0.0), (3.9, 60.42), (1.64, 51.5), (1.28, 51.25), (2.73, 53.04), (1.05, 51.01),
                      (1.67, 55.43), (4.38, 59.62), (1.51, 51.77), (4.33, 59.52)],
    # 5 ms a sample on a busy machine: a load share of 0.46, and 3-step stretches above 0.5
    "just below": [(27.37, 0.0), (28.67, 39.28), (27.01, 39.95), (28.69, 43.34), (36.4, 32.46), (27.97, 24.43),
                   (40.34, 56.1), (42.65, 44.66), (30.17, 21.68), (32.3, 37.55)],
    # 6.5 ms a sample: a load share of 0.51
    "just above": [(34.34, 0.0), (34.32, 12.09), (33.96, 18.8), (35.48, 19.53), (34.5, 19.59), (34.81, 26.78),
                   (42.26, 62.69), (46.52, 49.51), (61.0, 64.18), (46.99, 76.91)],
}


def _expected(steps, threshold=0.5, patience=3, every=2):
    """What the callback must conclude from recorded steps (warm-up: the first), worked out
    here from the monitor's documented rules: the window's load share against the threshold,
    an alert each time a ``patience``-step stretch's share rises above it, and the window's
    share logged every ``every`` steps."""
    load = np.array([s[0] for s in steps[1:]]) / 1000
    compute = np.array([s[1] for s in steps[1:]]) / 1000
    share = load.sum() / (load.sum() + compute.sum())
    alerts, above = 0, False
    for end in range(patience, len(load) + 1):
        stretch = load[end - patience:end].sum() / (load[end - patience:end] + compute[end - patience:end]).sum()
        alerts += stretch > threshold and not above
        above = stretch > threshold
    logged = [load[:k - 1].sum() / (load[:k - 1] + compute[:k - 1]).sum() for k in range(every, len(steps) + 1, every)]
    return share, alerts, logged


@pytest.mark.parametrize("name", list(RECORDED))
def test_the_callback_decides_on_recorded_steps(tmp_path, name):
    """Recorded steps played into a real fit (the data's fetch and the model's step advance the
    callback's clock by what they took in the recording): the callback measures exactly those
    steps, and its verdict, alerts and logged shares are the threshold applied to them, on
    either side of 0.5 by as little as the recordings are."""
    from dsconvert import DataLoadingMonitor
    from dsconvert.lightning import DataLoadingCallback

    steps = RECORDED[name]
    clock = _Clock()
    loader = torch.utils.data.DataLoader(_RecordedWaits(clock, [s[0] / 1000 for s in steps]), batch_size=None)
    callback = DataLoadingCallback(DataLoadingMonitor(window=10, patience=3, warmup=1), log_every_n_steps=2,
                                   clock=clock)
    with pytest.warns(UserWarning, match="input-bound") if name != "compute-bound" else _no_warning():
        trainer, header, metrics = _fit(callback, _Model(clock=clock, computes=[s[1] / 1000 for s in steps]),
                                        loader, tmp_path)
    monitor = callback.monitor
    measured = np.array(monitor._steps) * 1000
    assert monitor.startup_s * 1000 == pytest.approx(steps[0][0])
    assert measured == pytest.approx(np.array(steps[1:]))  # each wait and each step, as recorded
    share, alerts, logged = _expected(steps)
    assert abs(share - 0.5) > 0.01 if name.startswith("just") else abs(share - 0.5) > 0.2
    summary = monitor.summary()
    assert summary["load_share"] == pytest.approx(share)
    assert summary["verdict"] == ("input-bound" if share > 0.5 else "compute-bound")
    assert summary["verdict"] == ("compute-bound" if name in ("compute-bound", "just below") else "input-bound")
    assert summary["alerts"] == alerts and (alerts >= 1) == (name != "compute-bound")
    shares = _logged_shares(metrics)
    assert shares == pytest.approx(logged, rel=1e-5)
    assert float(trainer.progress_bar_metrics["data/load_share"]) == pytest.approx(logged[-1], rel=1e-5)


@contextlib.contextmanager
def _no_warning():
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*input-bound.*")
        yield
