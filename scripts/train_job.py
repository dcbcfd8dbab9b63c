"""A training-like job for diagnose's tests and benchmark: a DataLoader feeding a numpy "model".

    python scripts/train_job.py --data DIR [--converted] [--workers N] [--batch N] [--compute-ms MS]
                                [--print-rate]

Without --converted it reads an ImageFolder tree file by file as torchvision's ImageFolder
does (open, Image.open, convert("RGB")); with --converted it reads a dsconvert output through
dsconvert.open_dataset(decode="numpy"). Each step busies the CPU for --compute-ms. It prints
"ready" after its first batch and trains until it is stopped; with --print-rate, also the
steps done in each second ("rate N").
"""

import argparse
import os
import sys
import time

import numpy as np
import torch
from PIL import Image


class Folder(torch.utils.data.Dataset):
    def __init__(self, root):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(os.path.join(root, c, n), i) for i, c in enumerate(classes)
                        for n in sorted(os.listdir(os.path.join(root, c)))]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        return torch.from_numpy(np.asarray(img)[:32, :32].copy()), label


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--converted", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--compute-ms", type=float, default=5.0)
    p.add_argument("--print-rate", action="store_true")
    args = p.parse_args()
    if args.converted:
        import dsconvert

        ds = dsconvert.open_dataset(args.data, decode="numpy",
                                    transform=lambda a: torch.from_numpy(np.ascontiguousarray(a[:32, :32])))
    else:
        ds = Folder(args.data)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=args.workers, shuffle=True,
                                         persistent_workers=args.workers > 0)
    weights = np.ones((64, 64))
    first = True
    steps, tick = 0, time.monotonic() + 1
    while True:
        for images, labels in loader:
            end = time.perf_counter() + args.compute_ms / 1000
            while time.perf_counter() < end:  # the "model": CPU-bound numpy work
                weights = np.tanh(weights @ weights / 64)
            if first:
                print("ready", flush=True)
                first = False
            steps += 1
            if args.print_rate and time.monotonic() >= tick:
                print(f"rate {steps}", flush=True)
                steps, tick = 0, tick + 1


if __name__ == "__main__":
    sys.exit(main())
