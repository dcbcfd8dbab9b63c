"""CachedDataset: filled by DataLoader workers, killed mid-epoch, refilled, never corrupt."""

import glob
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dsconvert.data import CachedDataset

from conftest import make_image_folder, pil_loader, reference_image_folder


class Folder:
    """A map-style ImageFolder stand-in (torchvision need not be installed)."""

    def __init__(self, root, forbid=False):
        self.samples = reference_image_folder(root)
        self.forbid = forbid

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        if self.forbid:
            raise AssertionError(f"the wrapped dataset was read for sample {i}")
        path, label = self.samples[i]
        return pil_loader(path), label


@pytest.fixture
def folder(tmp_path, photos):
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"a": 20, "b": 20}, size=(64, 48))
    return root


def _check_all(ds, root):
    for i, (path, label) in enumerate(reference_image_folder(root)):
        image, got = ds[i]
        assert got == label and np.array_equal(np.asarray(image), np.asarray(pil_loader(path))), i


def as_array(image):
    return np.asarray(image).copy()


def test_first_epoch_fills_later_epochs_read_the_cache(tmp_path, folder, torch):
    from torch.utils.data import DataLoader

    cache = str(tmp_path / "cache")
    ds = CachedDataset(Folder(folder), cache)
    assert isinstance(ds, torch.utils.data.Dataset)
    loader = DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda x: x)
    assert sum(1 for _ in loader) == 40
    assert len(glob.glob(os.path.join(cache, "data-*.bin"))) == 2  # one per worker
    cached = CachedDataset(Folder(folder, forbid=True), cache)
    assert cached.is_complete
    _check_all(cached, folder)  # consolidates: index.npy written, CRCs checked once
    assert os.path.exists(os.path.join(cache, "index.npy"))
    again = CachedDataset(Folder(folder, forbid=True), cache, decode="numpy", transform=as_array)
    out = list(DataLoader(again, batch_size=None, num_workers=2, collate_fn=lambda x: x))
    assert len(out) == 40 and all(isinstance(img, np.ndarray) and img.shape == (48, 64, 3) for img, _ in out)


FILL_SCRIPT = r"""
import os, sys
# the tests' folder (test_cached, conftest) and the repository root (conftest imports tests.support)
sys.path[:0] = [sys.argv[3], os.path.dirname(os.path.abspath(sys.argv[3]))]
import time
from torch.utils.data import DataLoader
from test_cached import Folder
from dsconvert.data import CachedDataset

class Slow(Folder):
    def __getitem__(self, i):
        time.sleep(0.02)
        return super().__getitem__(i)

ds = CachedDataset(Slow(sys.argv[1]), sys.argv[2])
for _ in DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda x: x):
    pass
"""


@pytest.mark.slow
def test_killed_mid_epoch_then_completed_never_corrupt(tmp_path, folder, torch):
    from torch.utils.data import DataLoader

    cache = str(tmp_path / "cache")
    script = tmp_path / "fill.py"
    script.write_text(FILL_SCRIPT)
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.Popen([sys.executable, str(script), folder, cache, here], start_new_session=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            logs = glob.glob(os.path.join(cache, "log-*.bin"))
            if sum(os.path.getsize(p) for p in logs) >= 8 * 44:
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its two workers
    finally:
        proc.wait()
    partial = CachedDataset(Folder(folder), cache)
    st = partial._st()
    assert 8 <= len(st.entries) < 40, "the kill came too late to test a partial cache"
    # a torn record at the end of a log, as a kill inside write() leaves it
    with open(sorted(glob.glob(os.path.join(cache, "log-*.bin")))[0], "ab") as f:
        f.write(b"\x01\x02\x03")
    # damage the pixels of one cached sample: its CRC must catch it
    name, offset = next(iter(st.entries.values()))[:2]
    with open(os.path.join(cache, name), "r+b") as f:
        f.seek(offset + 10)
        f.write(b"\xff\x00\xff")
    refill = CachedDataset(Folder(folder), cache)
    loader = DataLoader(refill, batch_size=None, num_workers=2, collate_fn=lambda x: x)
    assert sum(1 for _ in loader) == 40
    final = CachedDataset(Folder(folder, forbid=True), cache)
    assert final.is_complete
    _check_all(final, folder)


def test_wrong_dataset_for_the_cache_is_refused(tmp_path, folder):
    from dsconvert import ManifestError

    cache = str(tmp_path / "cache")
    CachedDataset(Folder(folder), cache)[0]
    small = Folder(folder)
    small.samples = small.samples[:5]
    with pytest.raises(ManifestError, match="caches a dataset of 40 samples, not 5"):
        CachedDataset(small, cache)


def test_grayscale_and_arrays(tmp_path):
    class Arrays:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            shape = [(5, 7), (6, 4, 3), (2, 9, 3)][i]
            return rng.integers(0, 255, shape, dtype=np.uint8), i

    ds = CachedDataset(Arrays(), str(tmp_path / "c"), decode="numpy")
    first = [ds[i][0].copy() for i in range(3)]
    again = CachedDataset(Arrays(), str(tmp_path / "c"), decode="numpy")
    for i in range(3):
        assert np.array_equal(again[i][0], first[i]) and again[i][0].shape == Arrays()[i][0].shape
    with pytest.raises(IndexError):
        again[3]
