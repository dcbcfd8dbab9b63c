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
from dsconvert.errors import OptionError

from conftest import make_image_folder, pil_loader, reference_image_folder


class Folder:
    """A map-style ImageFolder stand-in (torchvision need not be installed)."""

    def __init__(self, root, forbid=False):
        self.root = root
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


def cached_only(root, cache, **kw):
    """A CachedDataset that may read its wrapped dataset only for the few samples that identify
    the cache when it is opened, never afterwards."""
    wrapped = Folder(root)
    ds = CachedDataset(wrapped, cache, **kw)
    wrapped.forbid = True
    return ds


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
    cached = cached_only(folder, cache)
    assert cached.is_complete
    _check_all(cached, folder)  # consolidates: index.npy written, CRCs checked once
    assert os.path.exists(os.path.join(cache, "index.npy"))
    again = cached_only(folder, cache, decode="numpy", transform=as_array)
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
from dsconvert.errors import OptionError

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
    final = cached_only(folder, cache)
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


class Arrays:
    """A map-style dataset of seeded arrays (no paths, no identity of its own)."""

    def __init__(self, n=12, seed=0, changed=(), labels=None):
        self.n, self.seed, self.changed, self.labels = n, seed, set(changed), labels

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng([self.seed, i, i in self.changed])
        label = self.labels[i] if self.labels else i % 3
        return rng.integers(0, 255, (6, 5, 3), dtype=np.uint8), label


class Augmented(Arrays):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return np.roll(image, np.random.randint(1, 5), axis=1), label


def test_a_cache_is_never_served_for_another_dataset(tmp_path, folder, photos):
    """Issue 40, item 3, the whole class: a cache made for one dataset, opened for another of
    the same length, is refused in one line whatever differs (another folder of the same
    layout, other images, other labels, another dsconvert output, a dataset that names no
    identity, a caller's identity, a wrapped dataset that augments at random), and opened
    again for its own dataset (by another path too) it serves that dataset's pixels. Only a
    difference outside the sampled samples goes unseen, as the module says: an identity then."""
    from dsconvert import ManifestError, convert, open_dataset

    def fill(ds, cache, **kw):
        cached = CachedDataset(ds, cache, decode="numpy", **kw)
        return [cached[i][0].copy() for i in range(len(cached))], cached

    other = str(tmp_path / "other")
    make_image_folder(other, photos, {"a": 20, "b": 20}, size=(64, 48), seed=1)  # same names, other images
    relabelled = Folder(folder)
    relabelled.samples = [(p, 1 - y) for p, y in relabelled.samples]
    out_a, out_b = str(tmp_path / "out-a"), str(tmp_path / "out-b")
    convert(folder, out_a, workers=1)
    convert(other, out_b, workers=1)
    cases = [  # (the cache's dataset, another of the same length, options of each)
        (Folder(folder), Folder(other), {}, {}),
        (Folder(folder), relabelled, {}, {}),
        (open_dataset(out_a, decode="numpy"), open_dataset(out_b, decode="numpy"), {}, {}),
        (Arrays(seed=0), Arrays(seed=1), {}, {}),
        (Arrays(), Arrays(labels=[5] * 12), {}, {}),
        (Arrays(), Arrays(changed=[0]), {}, {}),
        (Arrays(), Arrays(changed=[11]), {}, {}),
        (Arrays(), Arrays(), {"identity": "v1"}, {"identity": "v2"}),
        (Arrays(), Arrays(changed=range(1, 11)), {"identity": "v1"}, {"identity": "v2"}),
        (Augmented(), Augmented(), {}, {}),
    ]
    for k, (ds, another, mine, theirs) in enumerate(cases):
        cache = str(tmp_path / f"cache-{k}")
        pixels, _ = fill(ds, cache, **mine)
        with pytest.raises(ManifestError, match="caches") as err:
            CachedDataset(another, cache, **theirs)
        assert "\n" not in str(err.value), k
        if isinstance(ds, Augmented):
            assert "transform=" in str(err.value)
            continue
        again, reopened = fill(ds, cache, **mine)  # its own dataset: served from the cache
        assert reopened.is_complete and all(np.array_equal(x, y) for x, y in zip(again, pixels)), k
    moved = str(tmp_path / "moved")
    os.rename(folder, moved)  # the same folder under another path: the same dataset
    fill(Folder(moved), str(tmp_path / "cache-0"))
    # the limit the module states: a difference only outside the sampled samples needs an identity
    cache = str(tmp_path / "cache-limit")
    fill(Arrays(), cache)
    CachedDataset(Arrays(changed=set(range(12)) - set(_sampled(12))), cache)  # not seen, as documented
    with open(os.path.join(cache, "cache.json"), "w") as f:
        f.write('{"schema_version": 1, "num_samples": 12}')  # an earlier version's: cannot be identified
    with pytest.raises(ManifestError, match="cannot identify"):
        CachedDataset(Arrays(), cache)
    with pytest.raises(OptionError):
        CachedDataset(Arrays(), str(tmp_path / "c"), identity=3)


def _sampled(n):
    from dsconvert.readers.cached import sampled_positions

    return sampled_positions(n)


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
