"""A training-like job for diagnose's tests and benchmark: a DataLoader feeding a numpy "model".

    python tests/support/train_job.py (--data DIR [--converted | --pickles] | --in-memory N)
                                      [--workers N] [--batch N] [--compute-ms MS]
                                      [--augment scipy|cv2|numpy|python] [--print-rate]

Without --converted it reads an ImageFolder tree file by file as torchvision's ImageFolder
does (open, Image.open, convert("RGB")); with --converted it reads a dsconvert output through
dsconvert.open_dataset(decode="numpy"); with --pickles it reads every ``*.pkl`` file under DIR
(a pickled ``(HxWx3 uint8 array, label)``, see :func:`write_pickles`); with --in-memory N it
makes N random images in memory and opens no data file. --augment runs a
transform object on each decoded image before the crop that goes into the batch: a blur and
a rotation in scipy.ndimage, a denoise, blur and rotation in OpenCV, a flip, brightness
jitter and noise in numpy, or a per-pixel jitter in plain Python. --workers 0 loads in the
training loop itself. Each step busies the CPU for --compute-ms. It prints "ready" after its
first batch and trains until it is stopped; with --print-rate, also the steps done in each
second ("rate N").
"""

import argparse
import os
import pickle
import random
import sys
import time

import numpy as np
import torch
from PIL import Image


class ScipyAugment:
    def __call__(self, arr):
        from scipy import ndimage

        arr = ndimage.gaussian_filter(arr, sigma=(1.5, 1.5, 0))
        return ndimage.rotate(arr, random.uniform(-10, 10), axes=(0, 1), reshape=False, order=1)


class OpenCVAugment:
    def __call__(self, arr):
        import cv2

        h, w = arr.shape[:2]
        arr = cv2.bilateralFilter(arr, 9, 75, 75)  # edge-preserving denoise
        arr = cv2.GaussianBlur(arr, (9, 9), 1.5)
        m = cv2.getRotationMatrix2D((w / 2, h / 2), random.uniform(-10, 10), 1.0)
        return cv2.warpAffine(arr, m, (w, h))


class NumpyAugment:
    def __call__(self, arr):
        rng = np.random.default_rng()
        out = arr[:, ::-1].astype(np.float32)
        out = out * rng.uniform(0.8, 1.2) + rng.normal(0, 8, out.shape).astype(np.float32)
        return np.clip(out, 0, 255).astype(np.uint8)


class PythonAugment:
    def __call__(self, arr):
        crop = arr[:200, :200].tolist()
        for row in crop:
            for px in row:
                for c in range(3):
                    px[c] = min(255, max(0, px[c] + random.randint(-8, 8)))
        return np.array(crop, dtype=np.uint8)


AUGMENTS = {"scipy": ScipyAugment, "cv2": OpenCVAugment, "numpy": NumpyAugment, "python": PythonAugment}


class Folder(torch.utils.data.Dataset):
    def __init__(self, root, transform=None):
        classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
        self.samples = [(os.path.join(root, c, n), i) for i, c in enumerate(classes)
                        for n in sorted(os.listdir(os.path.join(root, c)))]
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        arr = np.asarray(img)
        if self.transform is not None:
            arr = self.transform(arr)
        return torch.from_numpy(arr[:32, :32].copy()), label


class Pickles(torch.utils.data.Dataset):
    """Samples pickled one per file, as many research datasets are stored."""

    def __init__(self, root, transform=None):
        self.paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(".pkl"))
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            arr, label = pickle.load(f)
        if self.transform is not None:
            arr = self.transform(arr)
        return torch.from_numpy(arr[:32, :32].copy()), label


class NpyFiles(torch.utils.data.Dataset):
    """Small arrays saved one per file with np.save, np.load-ed one per sample."""

    def __init__(self, root, transform=None):
        self.paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names if n.endswith(".npy"))
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        arr = np.load(self.paths[i])
        if self.transform is not None:
            arr = self.transform(arr)
        return torch.from_numpy(arr), i % 3


class InMemory(torch.utils.data.Dataset):
    """Images generated into memory at start: no data file is ever open."""

    def __init__(self, n, transform=None):
        rng = np.random.default_rng(0)
        self.images = [rng.integers(0, 256, (1200, 1600, 3), dtype=np.uint8) for _ in range(n)]
        self.transform = transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        arr = self.images[i]
        if self.transform is not None:
            arr = self.transform(arr)
        return torch.from_numpy(arr[:32, :32].copy()), i % 3


def write_pickles(root, images):
    """``images``: (HxWx3 uint8 array, label) pairs, written as ROOT/sample_N.pkl."""
    os.makedirs(root, exist_ok=True)
    for i, (arr, label) in enumerate(images):
        with open(os.path.join(root, f"sample_{i:04d}.pkl"), "wb") as f:
            pickle.dump((arr, label), f, protocol=4)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data")
    p.add_argument("--converted", action="store_true")
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--compute-ms", type=float, default=5.0)
    p.add_argument("--print-rate", action="store_true")
    p.add_argument("--augment", choices=sorted(AUGMENTS))
    p.add_argument("--pickles", action="store_true")
    p.add_argument("--npy", action="store_true", help="--data holds .npy arrays, np.load-ed one per sample")
    p.add_argument("--in-memory", type=int, metavar="N", help="N random 1200x1600 images held in memory, no --data")
    args = p.parse_args()
    if (args.data is None) == (args.in_memory is None):
        p.error("give --data DIR or --in-memory N")
    transform = AUGMENTS[args.augment]() if args.augment else None
    if args.in_memory:
        ds = InMemory(args.in_memory, transform)
    elif args.converted:
        import dsconvert

        ds = dsconvert.open_dataset(args.data, decode="numpy",
                                    transform=lambda a: torch.from_numpy(np.ascontiguousarray(a[:32, :32])))
    elif args.pickles:
        ds = Pickles(args.data, transform)
    elif args.npy:
        ds = NpyFiles(args.data, transform)
    else:
        ds = Folder(args.data, transform)
    loader = torch.utils.data.DataLoader(ds, batch_size=args.batch, num_workers=args.workers, shuffle=True,
                                         persistent_workers=args.workers > 0)
    weights = np.ones((64, 64))
    first = True
    steps, tick = 0, time.monotonic() + 1
    while True:
        for _images, _labels in loader:
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
