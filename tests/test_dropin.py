"""open_dataset as a drop-in for ImageFolder: random access over every output, the same samples
in the same batches as ImageFolder under the same DataLoader and seed, any sampler, exact len."""

import os

import numpy as np
import pytest

from dsconvert import convert, open_dataset
from dsconvert.errors import ManifestError, OptionError
from dsconvert.manifest import ORDER_NAME, Manifest

from conftest import make_image_folder, pil_loader, reference_image_folder

torch = pytest.importorskip("torch")
from torch.utils.data import (  # noqa: E402
    DataLoader,
    Dataset,
    DistributedSampler,
    RandomSampler,
    Subset,
    WeightedRandomSampler,
)


def to_array(image):
    """A transform DataLoader workers can pickle: the image's pixels as a tensor."""
    return torch.from_numpy(np.array(image))


class ReferenceImageFolder(Dataset):
    """torchvision's ImageFolder where torchvision is installed, else its make_dataset and
    loader as they are written there (conftest.reference_image_folder)."""

    def __init__(self, root, transform=None):
        try:
            from torchvision.datasets import ImageFolder
        except Exception:  # not installed, or a torch it does not import beside
            self.inner = None
            self.samples = reference_image_folder(root)
        else:
            self.inner = ImageFolder(root)
            self.samples = self.inner.samples
        self.transform = transform

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        image = pil_loader(path)
        return (self.transform(image) if self.transform else image), label


@pytest.fixture(scope="module")
def sorted_source(tmp_path_factory, photos):
    """A class-sorted ImageFolder of 3 classes, 75 images, converted to wds in 6 shards."""
    root = tmp_path_factory.mktemp("dropin")
    src = str(root / "src")
    make_image_folder(src, photos, {"ant": 30, "bee": 25, "cow": 20}, size=(24, 16))
    out = str(root / "wds")
    convert(src, out, samples_per_shard=13, workers=1)
    return src, out


def batches(loader):
    return [(images.clone(), labels.clone()) for images, labels in loader]


def test_a_labelled_wds_output_stores_a_shuffled_order_and_reads_in_the_source_order(sorted_source):
    src, out = sorted_source
    manifest = Manifest.load(out)
    assert manifest.order is not None and os.path.exists(os.path.join(out, ORDER_NAME))
    ds = open_dataset(out, decode="raw")
    assert type(ds).__name__ == "MapDataset" and len(ds) == 75
    reference = reference_image_folder(src)
    for i in range(len(ds)):
        raw, label = ds[i]
        path, want = reference[i]
        assert label == want and raw == open(path, "rb").read()
    stored = [label for raw, label in open_dataset(out, decode="raw", stream=True)]
    assert stored != sorted(stored)  # the shards do not hold the classes one after the other


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_shuffle_gives_imagefolders_batches(sorted_source, workers):
    src, out = sorted_source
    ours = open_dataset(out, transform=to_array)
    theirs = ReferenceImageFolder(src, transform=to_array)

    def loader(ds):
        g = torch.Generator().manual_seed(7)
        return DataLoader(ds, batch_size=16, shuffle=True, num_workers=workers, generator=g)

    got, want = batches(loader(ours)), batches(loader(theirs))
    assert len(got) == len(want) == len(loader(ours)) == 5
    assert [len(labels) for _, labels in got] == [16, 16, 16, 16, 11]
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)


@pytest.mark.parametrize("make_sampler", [
    lambda ds: DistributedSampler(ds, num_replicas=2, rank=1, seed=3),
    lambda ds: RandomSampler(ds, generator=torch.Generator().manual_seed(1)),
    lambda ds: WeightedRandomSampler([1.0 + (i % 3) for i in range(len(ds))], 40,
                                     generator=torch.Generator().manual_seed(2)),
], ids=["distributed", "random", "weighted"])
def test_any_sampler_reads_imagefolders_samples(sorted_source, make_sampler):
    src, out = sorted_source
    ours, theirs = open_dataset(out, transform=to_array), ReferenceImageFolder(src, transform=to_array)
    got = batches(DataLoader(ours, batch_size=8, sampler=make_sampler(ours), num_workers=2))
    want = batches(DataLoader(theirs, batch_size=8, sampler=make_sampler(theirs)))
    assert len(got) == len(want)
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_subset_and_negative_indices(sorted_source):
    src, out = sorted_source
    ds = open_dataset(out, decode="raw")
    reference = reference_image_folder(src)
    sub = Subset(ds, [74, 0, 40])
    assert [label for _, label in sub] == [reference[i][1] for i in (74, 0, 40)]
    assert ds[-1] == ds[74]
    with pytest.raises(IndexError):
        ds[75]


def test_len_of_the_loader_is_the_batches_it_gives(sorted_source):
    _, out = sorted_source
    ds = open_dataset(out, transform=to_array)
    for workers in (0, 2, 3):
        loader = DataLoader(ds, batch_size=32, num_workers=workers)
        assert [len(labels) for _, labels in loader] == [32, 32, 11] and len(loader) == 3


def test_source_order_and_other_seeds(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 40, "b": 40}, size=(16, 16))
    labels = {}
    for name, kw in (("source", {"order": "source"}), ("s0", {}), ("s0w2", {"workers": 2}), ("s1", {"seed": 1})):
        out = str(tmp_path / name)
        kw.setdefault("workers", 1)
        convert(src, out, samples_per_shard=20, **kw)
        labels[name] = [label for _, label in open_dataset(out, decode="raw", stream=True)]
        assert [label for _, label in open_dataset(out, decode="raw")] == [0] * 40 + [1] * 40
    assert labels["source"] == [0] * 40 + [1] * 40
    assert labels["s0"] == labels["s0w2"] != labels["s1"]
    assert Manifest.load(str(tmp_path / "source")).order is None
    for a, b in (("s0", "s0w2"),):
        for name in sorted(os.listdir(tmp_path / a)):
            if name.endswith((".tar", ".npy")):
                assert (tmp_path / a / name).read_bytes() == (tmp_path / b / name).read_bytes()


def test_an_order_file_changed_after_the_conversion_is_refused(sorted_source, tmp_path):
    import shutil

    _, out = sorted_source
    copy = str(tmp_path / "copy")
    shutil.copytree(out, copy)
    order = np.load(os.path.join(copy, ORDER_NAME))
    np.save(os.path.join(copy, ORDER_NAME), order[::-1].copy())  # a permutation, but not this output's
    with pytest.raises(ManifestError, match="sha256"):
        open_dataset(copy)
    from dsconvert.verify import verify

    assert any(p["path"] == ORDER_NAME for p in verify(copy)["problems"])


@pytest.mark.parametrize("data", [b"", b"\x93NUMPY garbage", None])
def test_order_files_that_are_not_permutations_are_refused(data):
    import io

    from dsconvert.shuffle import load_order

    if data is None:
        buf = io.BytesIO()
        np.save(buf, np.array([0, 1, 1], dtype=np.int64))
        data = buf.getvalue()
    with pytest.raises(ManifestError):
        load_order(data, 3, "x")


def test_streaming_options_and_stream_false_disagree(sorted_source):
    _, out = sorted_source
    assert type(open_dataset(out, shuffle=True)).__name__ == "StreamDataset"
    assert type(open_dataset(out, stream=True)).__name__ == "StreamDataset"
    with pytest.raises(OptionError, match="streaming options"):
        open_dataset(out, stream=False, shuffle=True)


def test_dict_samples_by_index(tmp_path, photos):
    import random

    from conftest import crop, encode, write

    src = str(tmp_path / "flat")
    rng = random.Random(0)
    photo = next(iter(photos.values()))
    for i in range(10):
        write(os.path.join(src, f"s{i:02d}.jpg"), encode(crop(photo, rng, (16, 16))))
        write(os.path.join(src, f"s{i:02d}.json"), b'{"i": %d}' % i)
    out = str(tmp_path / "out")
    convert(src, out, workers=1)
    ds = open_dataset(out, decode="numpy")
    assert len(ds) == 10 and [ds[i]["json"]["i"] for i in range(10)] == list(range(10))
    assert ds[3]["__key__"] == "s03" and ds[3]["jpg"].shape == (16, 16, 3)


def test_batches_fetched_at_once_are_the_same_batches(sorted_source):
    """prefetch=True (latency-bound storage): a batch's members are requested concurrently,
    across shards; the batches are the ones pread gives."""
    _, out = sorted_source

    def loader(**kw):
        g = torch.Generator().manual_seed(3)
        return batches(DataLoader(open_dataset(out, transform=to_array, **kw), batch_size=16, shuffle=True,
                                  num_workers=2, generator=g))

    fetched, plain = loader(prefetch=True), loader(prefetch=False)
    assert len(fetched) == len(plain) == 5
    for (a, la), (b, lb) in zip(fetched, plain):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_a_shuffled_output_converted_again_keeps_imagefolders_order(sorted_source, tmp_path):
    """wds -> npy (the README's re-conversion): the new output reads the wds shards in their
    stored order, and each sample keeps its place in the original source, so ds[i] is still
    ImageFolder's sample i."""
    src, out = sorted_source
    for fmt, kw in (("npy", {"resize": 16}), ("hdf5", {}), ("wds", {"order": "source"})):
        again = str(tmp_path / fmt)
        convert(out, again, fmt, workers=2, **kw)
        ds = open_dataset(again, decode="numpy")
        want = open_dataset(out, decode="numpy")  # the first output, by index
        assert len(ds) == len(want) == 75
        assert [ds[i][1] for i in range(75)] == [label for _, label in reference_image_folder(src)]
        if fmt == "hdf5":
            assert all(np.array_equal(ds[i][0], want[i][0]) for i in range(0, 75, 7))


def test_verify_finds_an_order_that_no_longer_names_the_source(sorted_source, tmp_path):
    """The manifest's order entry removed, or two records' positions swapped with every digest
    made consistent again: ds[i] would be wrong; verify (with --source for the second) says so."""
    import hashlib
    import json
    import shutil

    from dsconvert.shuffle import order_bytes
    from dsconvert.verify import verify

    from support.records import read_record, write_record

    src, out = sorted_source
    assert verify(out, source=src)["ok"]
    dropped = str(tmp_path / "dropped")
    shutil.copytree(out, dropped)
    m = json.load(open(os.path.join(dropped, "dsconvert.json")))
    del m["order"]
    json.dump(m, open(os.path.join(dropped, "dsconvert.json"), "w"))
    assert not verify(dropped)["ok"]

    swapped = str(tmp_path / "swapped")
    shutil.copytree(out, swapped)
    m = json.load(open(os.path.join(swapped, "dsconvert.json")))
    entry = m["shards"][0]
    record_path = os.path.join(swapped, entry["index"])
    record = read_record(record_path)
    record["positions"][0], record["positions"][1] = record["positions"][1], record["positions"][0]
    write_record(record_path, record)
    data = open(record_path, "rb").read()
    entry["parts"][entry["index"]] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    stored = []
    for e in m["shards"]:
        stored += read_record(os.path.join(swapped, e["index"]))["positions"]
    order = order_bytes(stored)
    open(os.path.join(swapped, ORDER_NAME), "wb").write(order)
    m["order"] = {"name": ORDER_NAME, "bytes": len(order), "sha256": hashlib.sha256(order).hexdigest()}
    json.dump(m, open(os.path.join(swapped, "dsconvert.json"), "w"))
    assert verify(swapped)["ok"]  # consistent with itself
    report = verify(swapped, source=src)
    assert not report["ok"] and len(report["source"]["misplaced"]) == 2


def _digest(sample):
    """A sample's bytes and label, whatever its kind (encoded bytes, arrays, PIL images)."""
    parts = sample if isinstance(sample, tuple) else [sample[k] for k in sorted(sample)]
    out = []
    for part in parts:
        if isinstance(part, (bytes, bytearray, memoryview)):
            out.append(bytes(part))
        elif hasattr(part, "tobytes"):
            out.append(np.asarray(part).tobytes())
        else:
            out.append(repr(part).encode())
    return out


def test_every_dataset_takes_the_indices_imagefolder_takes(sorted_source, tmp_path):
    """Issue 40, item 14, the whole class: every dsconvert Dataset (an output of each map-style
    reader, a source read in place, a cache, a mixture, a subsample) takes exactly the indices
    ImageFolder's list indexing takes (the oracle: a list), giving the same sample as the int,
    and raises TypeError for every other (never reads sample 1 for 1.7 or '1');
    ``Subset(ds, torch.randperm(n)[:k])`` reads through a DataLoader as with ImageFolder."""
    from dsconvert import mix, open_source, subsample
    from dsconvert.data import CachedDataset

    src, out = sorted_source
    h5 = str(tmp_path / "h5")
    convert(src, h5, format="hdf5", workers=1)
    wds = open_dataset(out, decode="raw")
    datasets = {
        "wds": wds,
        "hdf5": open_dataset(h5, decode="raw"),
        "source": open_source(src, decode="raw"),
        "cached": CachedDataset(ReferenceImageFolder(src), str(tmp_path / "cache"), decode="numpy"),
        "mix": mix([wds, open_dataset(h5, decode="raw")], seed=1),
        "subsample": subsample(wds, 20, seed=2),
    }
    indices = [3, -2, np.int64(3), np.int32(-1), np.uint8(4), np.array(2), True, torch.tensor(3),
               torch.tensor(-2), torch.tensor([3]), torch.tensor(3, dtype=torch.int16), torch.tensor(True),
               2.7, 1.0, "3", "1", None, b"1", 3 + 0j, np.float64(3), np.array([1, 2]), np.array(1.0),
               torch.tensor(3.0), torch.tensor([1, 2]), [3], (3,)]
    for name, ds in datasets.items():
        n = len(ds)
        oracle = list(range(n))
        for index in indices:
            try:
                expected = oracle[index]
            except TypeError:
                with pytest.raises(TypeError, match="sample indices are integers"):
                    ds[index]
                with pytest.raises(TypeError, match="sample indices are integers"):
                    ds.__getitems__([0, index]) if hasattr(ds, "__getitems__") else ds[index]
                continue
            assert _digest(ds[index]) == _digest(ds[expected]), (name, index)
            if hasattr(ds, "__getitems__"):
                assert [_digest(x) for x in ds.__getitems__([index, 0])] == \
                    [_digest(ds[expected]), _digest(ds[0])], (name, index)
        for index in (n, -n - 1, torch.tensor(n), np.int64(-n - 1)):
            with pytest.raises(IndexError):
                ds[index]
        picked = torch.randperm(n, generator=torch.Generator().manual_seed(0))[:9]
        loader = DataLoader(Subset(ds, picked), batch_size=4, collate_fn=list)
        assert [_digest(x) for batch in loader for x in batch] == [_digest(ds[int(i)]) for i in picked], name


def test_encoded_hdf5_gives_buffers_by_index(sorted_source, tmp_path):
    src, _ = sorted_source
    out = str(tmp_path / "h5")
    convert(src, out, "hdf5", workers=1)
    ds = open_dataset(out, decode="buffer")
    buf, label = ds[5]
    path, want = reference_image_folder(src)[5]
    assert isinstance(buf, np.ndarray) and buf.tobytes() == open(path, "rb").read() and label == want
