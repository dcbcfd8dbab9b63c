"""Lightning: :class:`~dsconvert.monitor.DataLoadingMonitor` as a Callback, and
:class:`EpochCallback`, which keeps dsconvert datasets' epochs with the trainer's.

``Trainer(callbacks=[DataLoadingCallback()])`` times every training step's wait for its batch
(from the end of one batch to the start of the next: the fetch, plus Lightning's bookkeeping)
and its compute (``on_train_batch_start`` to ``on_train_batch_end``), and every
``log_every_n_steps`` logs ``data/load_ms`` (mean over the window), ``data/load_p99_ms``,
``data/compute_ms``, ``data/load_share`` and ``data/alerts`` to the trainer's loggers, the load
share in the progress bar too. A sustained input-bound stretch also warns once (rank zero).

Mid-epoch resumption: a torchdata ``StatefulDataLoader`` over a dsconvert dataset is saved in
Lightning's checkpoints and restored by ``fit(ckpt_path=...)``. Two gaps are Lightning's own,
and ``EpochCallback`` closes them: Lightning reshuffles through the loader's *sampler*, so an
IterableDataset (the wds reader) would read every epoch in the first one's order; and a
checkpoint taken at an epoch's last step holds a finished loader, which Lightning (2.6, with
torchdata 0.11) restores and then takes for the whole next epoch, skipping it.
Works with ``lightning`` (``lightning.pytorch``) or the older ``pytorch_lightning`` package.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterator, List, Optional

from .errors import MissingDependencyError
from .monitor import Alert, DataLoadingMonitor

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    try:
        import pytorch_lightning as pl  # type: ignore[no-redef]
    except ImportError:
        raise MissingDependencyError("dsconvert.lightning needs Lightning: pip install lightning") from None

__all__ = ["DataLoadingCallback", "EpochCallback"]

_FINISHED = "_iterator_finished"  # torchdata's StatefulDataLoader: the saved iterator had ended


class EpochCallback(pl.Callback):
    """``set_epoch(trainer.current_epoch)`` on dsconvert datasets before each epoch's iterator
    is made, and a loader state saved after an epoch's last batch dropped on load, so that the
    resumed run starts the next epoch instead of an empty one (see the module doc).

    ``datasets``: the datasets to keep in step; by default those of the trainer's train
    dataloaders (found through ``loader.dataset``) and, at the start of ``fit``, of a
    dataloader passed to ``fit`` directly. Pass them when a DataModule makes the loaders, so
    that the first epoch after a resume at an epoch boundary is shuffled as that epoch.
    """

    def __init__(self, *datasets: Any):
        super().__init__()
        self.datasets = list(datasets)
        self._first: Optional[int] = None  # the epoch the first iterator of a resumed fit reads

    def _targets(self, trainer: Any, loaders: Any = None) -> Iterator[Any]:
        seen: List[int] = []
        found: List[Any] = list(self.datasets)
        for loader in _flatten(loaders if loaders is not None else getattr(trainer, "train_dataloader", None)):
            found.append(getattr(loader, "dataset", None))
        for ds in found:
            if ds is not None and id(ds) not in seen and callable(getattr(ds, "set_epoch", None)):
                seen.append(id(ds))
                yield ds

    def _sync(self, trainer: Any, loaders: Any = None, epoch: Optional[int] = None) -> None:
        for ds in self._targets(trainer, loaders):
            ds.set_epoch(int(trainer.current_epoch) if epoch is None else epoch)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        loop = checkpoint.get("loops", {}).get("fit_loop", {})
        fit = loop.get("state_dict", {})
        states = fit.get("combined_loader")
        last = loop.get("epoch_loop.batch_progress", {}).get("is_last_batch")
        if states and (last or any(isinstance(s, dict) and s.get(_FINISHED) for s in states)):
            del fit["combined_loader"]  # an ended epoch: the next one starts afresh
            # ... with the iterator Lightning makes before any epoch hook, for the next epoch
            self._first = int(checkpoint.get("epoch", 0)) + 1

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        # the first iterator is made before any epoch hook: set the (restored) epoch now
        source = getattr(getattr(trainer, "fit_loop", None), "_data_source", None)
        instance = getattr(source, "instance", None)
        self._sync(trainer, instance if not isinstance(instance, (pl.LightningModule, pl.LightningDataModule))
                   else [], self._first)
        self._first = None

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._sync(trainer)


def _flatten(loaders: Any) -> Iterator[Any]:
    """The loaders in whatever Lightning holds: one, a CombinedLoader, a list or dict of them."""
    if loaders is None:
        return
    flattened = getattr(loaders, "flattened", None)
    if flattened is not None:
        yield from flattened
    elif isinstance(loaders, dict):
        for v in loaders.values():
            yield from _flatten(v)
    elif isinstance(loaders, (list, tuple)):
        for v in loaders:
            yield from _flatten(v)
    else:
        yield loaders


class DataLoadingCallback(pl.Callback):
    """Load vs compute time of each training step, in the trainer's loggers and progress bar.

    ``monitor``: a configured :class:`DataLoadingMonitor` (its window, threshold, patience);
    by default one with the defaults. ``log_every_n_steps``: defaults to the trainer's.
    ``sync``: wait for the GPU's queued work before a step's compute time ends; by default
    ``torch.cuda.synchronize`` when the module is on a CUDA device (kernels are asynchronous,
    so without it the wait for the batch would absorb the previous step's compute).
    """

    def __init__(self, monitor: Optional[DataLoadingMonitor] = None, log_every_n_steps: Optional[int] = None,
                 prog_bar: bool = True, sync: Optional[Callable[[], Any]] = None,
                 clock: Callable[[], float] = time.perf_counter):
        super().__init__()
        self.monitor = monitor or DataLoadingMonitor()
        self.monitor.on_alert = self._alert if self.monitor.on_alert is None else self.monitor.on_alert
        self.log_every_n_steps = log_every_n_steps
        self.prog_bar = prog_bar
        self.sync = sync
        self.clock = clock
        self._mark: Optional[float] = None  # when the loop asked for the next batch
        self._start = 0.0

    def _alert(self, alert: Alert) -> None:
        from lightning_utilities.core.rank_zero import rank_zero_warn

        rank_zero_warn(alert.message)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        self._mark = self.clock()

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        now = self.clock()
        self._load = now - (self._mark if self._mark is not None else now)
        self._start = now

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        sync = self.sync
        if sync is None and getattr(pl_module.device, "type", "cpu") == "cuda":
            import torch

            sync = torch.cuda.synchronize
        if sync is not None:
            sync()
        now = self.clock()
        self.monitor.record(self._load, now - self._start)
        every = self.log_every_n_steps or getattr(trainer, "log_every_n_steps", 50) or 50
        if self.monitor.steps % every == 0:
            s = self.monitor.summary(gpu=False)
            if s["window"]:
                pl_module.log("data/load_share", s["load_share"], prog_bar=self.prog_bar, on_step=True,
                              on_epoch=False, rank_zero_only=True)
                pl_module.log_dict({"data/load_ms": s["load_ms"]["mean"], "data/load_p99_ms": s["load_ms"]["p99"],
                                    "data/compute_ms": s["compute_ms"]["mean"], "data/alerts": float(s["alerts"])},
                                   on_step=True, on_epoch=False, rank_zero_only=True)
        self._mark = self.clock()  # Lightning's own work after the step counts as waiting for data
