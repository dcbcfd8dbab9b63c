"""open_dataset as a drop-in for ImageFolder, with DataLoader workers and ranks."""

import hashlib
import json
import os
from collections import Counter

import numpy as np
import pytest

from dsconvert import convert, open_dataset

from conftest import (
    encode,
    make_image_folder,
    pil_loader,
    reference_image_folder,
    same_pixels,
    write,
)


@pytest.fixture
def converted_mixed(tmp_path, mixed_folder):
    out = str(tmp_path / "out")
    convert(mixed_folder, out, samples_per_shard=3, workers=1)
    return mixed_folder, out


def test_same_samples_as_image_folder(converted_mixed):
    src, out = converted_mixed
    reference = reference_image_folder(src)
    ds = open_dataset(out)
    got = list(ds)
    assert len(ds) == len(got) == len(reference) == 7
    for (img, label), (path, ref_label) in zip(got, reference):
        ref = pil_loader(path)
        assert img.mode == "RGB" and label == ref_label
        assert same_pixels(img, ref), path
    assert ds.classes == ["c0", "c1", "c2"] and ds.class_to_idx == {"c0": 0, "c1": 1, "c2": 2}


def test_numpy_and_raw_modes(converted_mixed):
    src, out = converted_mixed
    reference = reference_image_folder(src)
    for (arr, _), (path, _) in zip(open_dataset(out, decode="numpy"), reference):
        ref = np.asarray(pil_loader(path))
        assert arr.dtype == np.uint8 and arr.shape == ref.shape
        assert np.abs(arr.astype(int) - ref).mean() <= 1.0
    for (raw, _), (path, _) in zip(open_dataset(out, decode="raw"), reference):
        assert raw == open(path, "rb").read()


def test_transforms_apply(converted_mixed):
    _, out = converted_mixed
    ds = open_dataset(out, transform=lambda im: im.size, target_transform=lambda y: y * 10)
    assert all(isinstance(size, tuple) and label % 10 == 0 for size, label in ds)


def _digest(sample):
    raw, label = sample
    return hashlib.sha1(raw).hexdigest(), label


@pytest.fixture(scope="module")
def big_out(tmp_path_factory, photos):
    tmp = tmp_path_factory.mktemp("big")
    src = str(tmp / "src")
    make_image_folder(src, photos, {"a": 23, "b": 17, "c": 13}, size=(32, 24))
    out = str(tmp / "out")
    convert(src, out, samples_per_shard=7, workers=1)  # 53 samples in 8 uneven shards
    return out


def _read_all(out, world, workers, **kw):
    from torch.utils.data import DataLoader

    per_rank = []
    for rank in range(world):
        ds = open_dataset(out, decode="raw", rank=rank, world_size=world, **kw)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        items = [_digest(s) for s in loader]
        assert len(items) == len(ds)
        per_rank.append(items)
    return per_rank


def test_two_ranks_with_workers_read_each_sample_exactly_once(big_out, torch):
    everything = Counter(_digest(s) for s in open_dataset(big_out, decode="raw"))
    assert sum(everything.values()) == 53
    per_rank = _read_all(big_out, world=2, workers=2, even=None)
    assert sorted(len(r) for r in per_rank) == [26, 27]
    assert Counter(x for r in per_rank for x in r) == everything


def test_balanced_for_awkward_world_sizes(big_out):
    for world in (3, 5, 8):
        lengths = [len(open_dataset(big_out, rank=r, world_size=world, even=None)) for r in range(world)]
        assert sum(lengths) == 53 and max(lengths) - min(lengths) <= 1
        padded = [len(open_dataset(big_out, rank=r, world_size=world)) for r in range(world)]  # the default
        assert padded == [max(lengths)] * world


def test_even_pad_and_drop(big_out, torch):
    everything = Counter(_digest(s) for s in open_dataset(big_out, decode="raw"))
    padded = _read_all(big_out, world=4, workers=2, even="pad")
    assert [len(r) for r in padded] == [14, 14, 14, 14]
    seen = Counter(x for r in padded for x in r)
    assert set(seen) == set(everything) and sum(seen.values()) == 56
    assert _read_all(big_out, world=4, workers=2, even="pad") == padded  # deterministic
    dropped = _read_all(big_out, world=4, workers=1, even="drop")
    assert [len(r) for r in dropped] == [13, 13, 13, 13]
    seen = Counter(x for r in dropped for x in r)
    assert max(seen.values()) == 1 and len(seen) == 52


def test_more_ranks_than_samples_does_not_hang(big_out, torch):
    from torch.utils.data import DataLoader

    lengths = []
    for rank in range(60):
        ds = open_dataset(big_out, decode="raw", rank=rank, world_size=60, even=None)
        items = list(DataLoader(ds, batch_size=None, num_workers=2)) if rank in (0, 59) else list(ds)
        lengths.append(len(items))
        assert len(items) == len(ds)
    assert sum(lengths) == 53 and set(lengths) == {0, 1}


def test_rank_from_environment(big_out, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = open_dataset(big_out, decode="raw", stream=True)
    assert len(ds) == 27
    assert len(open_dataset(big_out, rank=0, world_size=1)) == 53  # arguments win
    assert len(open_dataset(big_out, decode="raw")) == 53  # map-style: the sampler shards it


def test_shuffle_is_seeded_per_epoch_and_still_exactly_once(big_out, torch):
    from torch.utils.data import DataLoader

    def epoch(e, seed=0):
        ds = open_dataset(big_out, decode="raw", shuffle=True, seed=seed, buffer_size=10)
        ds.set_epoch(e)
        return [_digest(s) for s in DataLoader(ds, batch_size=None, num_workers=2)]
    plain = [_digest(s) for s in open_dataset(big_out, decode="raw")]
    e0, e0_again, e1 = epoch(0), epoch(0), epoch(1)
    assert e0 == e0_again and e0 != e1 and e0 != plain
    assert Counter(e0) == Counter(e1) == Counter(plain)
    assert epoch(0, seed=1) != e0


def test_batched_loader_collates_tensors(big_out, torch):
    from torch.utils.data import DataLoader

    ds = open_dataset(big_out, transform=lambda im: torch.from_numpy(np.asarray(im.resize((16, 16)))))
    batches = list(DataLoader(ds, batch_size=8, num_workers=2))
    assert sum(len(b[1]) for b in batches) == 53
    assert batches[0][0].shape == (8, 16, 16, 3) and batches[0][1].dtype == torch.int64


def test_dict_samples_for_flat_sources(tmp_path, photos):
    src = str(tmp_path / "flat")
    img = photos["astronaut"].resize((20, 10))
    write(os.path.join(src, "a.v1.jpg"), encode(img))
    write(os.path.join(src, "a.v1.json"), json.dumps({"caption": "astronaut"}).encode())
    write(os.path.join(src, "a.v1.cls"), b"4")
    write(os.path.join(src, "b.png"), encode(img, "PNG"))
    write(os.path.join(src, "b.txt"), "légende".encode())
    out = str(tmp_path / "out")
    convert(src, out, workers=1)
    samples = list(open_dataset(out))
    assert [s["__key__"] for s in samples] == ["a%2Ev1", "b"]
    a, b = samples
    assert a["json"] == {"caption": "astronaut"} and a["cls"] == 4 and a["jpg"].mode == "RGB"
    assert b["txt"] == "légende" and same_pixels(b["png"], img)
    arrays = list(open_dataset(out, decode="numpy"))
    assert arrays[1]["png"].shape == (10, 20, 3)
    raw = list(open_dataset(out, decode="raw"))
    assert raw[0]["json"] == json.dumps({"caption": "astronaut"}).encode()
    keyed = list(open_dataset(out, transform=lambda s: s["__key__"]))
    assert keyed == ["a%2Ev1", "b"]


def test_is_a_torch_dataset_map_style_by_default_and_iterable_as_a_stream(big_out, torch):
    ds = open_dataset(big_out, decode="raw")
    assert isinstance(ds, torch.utils.data.Dataset) and not isinstance(ds, torch.utils.data.IterableDataset)
    assert isinstance(open_dataset(big_out, decode="raw", stream=True), torch.utils.data.IterableDataset)


def test_works_without_torch_semantics(big_out):
    with pytest.raises(ValueError, match="decode must be one of"):
        open_dataset(big_out, decode="tensor")
    with pytest.raises(ValueError, match="even must be one of"):
        open_dataset(big_out, even="yes")


def test_buffer_mode_is_zero_copy(converted_mixed):
    import mmap

    src, out = converted_mixed
    reference = reference_image_folder(src)
    for prefetch in (False, True):
        views = list(open_dataset(out, decode="buffer", prefetch=prefetch))
        views.sort(key=lambda v: bytes(v[0]))  # the stored order is shuffled
        for (buf, label), (path, ref_label) in zip(views, sorted(reference, key=lambda r: open(r[0], "rb").read())):
            assert buf.dtype == np.uint8 and not buf.flags.writeable
            assert buf.tobytes() == open(path, "rb").read() and label == ref_label
    for ds in (open_dataset(out, decode="buffer", stream=True), open_dataset(out, decode="buffer")):
        first = next(iter(ds))[0]
        while isinstance(first, np.ndarray):
            first = first.base
        assert isinstance(first, mmap.mmap) or (isinstance(first, memoryview) and isinstance(first.obj, mmap.mmap))


def test_buffer_mode_crosses_workers(converted_mixed, torch):
    from torch.utils.data import DataLoader

    src, out = converted_mixed
    reference = reference_image_folder(src)
    got = list(DataLoader(open_dataset(out, decode="buffer"), batch_size=None, num_workers=2))
    assert sorted(np.asarray(b).tobytes() for b, _ in got) == sorted(open(p, "rb").read() for p, _ in reference)
