"""Stop a Lightning run mid-epoch and resume it exactly, from a dsconvert output.

    python examples/lightning_resume.py OUT WORKDIR --crash-at 5   # dies before step 5
    python examples/lightning_resume.py OUT WORKDIR                # resumes from WORKDIR/last.ckpt, if any

OUT is any dsconvert output (``dsconvert shard SRC -o OUT``). The loader is torchdata's
StatefulDataLoader, whose state Lightning keeps in every checkpoint; a checkpoint is written
after every step here, so the resumed run starts at the step the first one never finished.
``EpochCallback`` reshuffles the dataset every epoch (Lightning only reaches samplers) and
resumes correctly from a checkpoint taken at an epoch's last step. Each step's epoch and sample
fingerprints are appended to WORKDIR/seen.jsonl (the test reads them: the two runs together
read what one uninterrupted run reads, step by step).
"""

import argparse
import hashlib
import json
import os

import lightning.pytorch as pl
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from dsconvert import open_dataset
from dsconvert.lightning import DataLoadingCallback, EpochCallback


class Fingerprint:
    """Encoded image -> (a 1-feature tensor, its 8-byte digest as an int): a stand-in for a real
    transform that still lets the run say which samples it trained on."""

    def __call__(self, raw: bytes):
        h = int.from_bytes(hashlib.sha1(bytes(raw)).digest()[:7], "little")
        return torch.tensor([len(raw) / 1e4]), h


class Tiny(pl.LightningModule):
    def __init__(self, log_path: str, num_classes: int):
        super().__init__()
        self.layer = torch.nn.Linear(1, num_classes)  # one logit per class of the output
        self.log_path = log_path

    def training_step(self, batch, batch_idx):
        (features, ids), labels = batch
        with open(self.log_path, "a") as f:
            f.write(json.dumps({"epoch": self.current_epoch, "step": self.global_step, "ids": ids.tolist()}) + "\n")
        return torch.nn.functional.cross_entropy(self.layer(features), labels)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class CrashAt(pl.Callback):
    """A preemption: the process dies as step ``step`` begins."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            raise SystemExit(f"preempted before step {self.step}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("workdir")
    ap.add_argument("--crash-at", type=int)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=1)
    args = ap.parse_args()
    os.makedirs(args.workdir, exist_ok=True)

    # whole batches built in the workers: len() is exact for any number of workers, which
    # Lightning takes as the epoch's length, and samples_seen alone says where a job stopped
    ds = open_dataset(args.out, transform=Fingerprint(), decode="raw", shuffle=True, seed=0, batch_size=4)
    loader = StatefulDataLoader(ds, batch_size=None, num_workers=args.workers)
    checkpoints = pl.callbacks.ModelCheckpoint(dirpath=args.workdir, every_n_train_steps=1, save_last=True,
                                               save_top_k=0)
    callbacks = [checkpoints, EpochCallback(ds), DataLoadingCallback(log_every_n_steps=2)]
    if args.crash_at is not None:
        callbacks.append(CrashAt(args.crash_at))
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=1, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False)
    last = os.path.join(args.workdir, "last.ckpt")
    num_classes = max(len(ds.classes or []), 1)
    trainer.fit(Tiny(os.path.join(args.workdir, "seen.jsonl"), num_classes), loader,
                ckpt_path=last if os.path.exists(last) else None)


if __name__ == "__main__":
    main()
