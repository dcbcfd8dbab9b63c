"""Batches built in the worker: wds ``batch_size=`` (DataLoader(batch_size=None)) and the
map-style ``__getitems__`` the DataLoader calls once per batch."""

from __future__ import annotations

import pytest

from dsconvert import convert, open_dataset
from dsconvert.transforms import CropToTensor, RandomResizedCropToTensor

from conftest import make_image_folder

pytestmark = pytest.mark.usefixtures("torch")


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("batches")
    src = str(root / "photos")
    make_image_folder(src, photos, {"a": 23, "b": 18}, size=(120, 90))
    out = {}
    for fmt in ("wds", "npy"):
        out[fmt] = str(root / fmt)
        convert(src, out[fmt], format=fmt, samples_per_shard=10)
    return out


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("decode", ["fused", "pil"])
def test_wds_batches_hold_every_sample_once_in_whole_batches(torch, outputs, workers, decode):
    from torch.utils.data import DataLoader

    T = CropToTensor(64, resize=72)
    ds = open_dataset(outputs["wds"], transform=T, decode=decode, batch_size=8)
    assert len(ds) == 6  # 41 samples: 5 batches of 8 and one of 1, whatever the workers
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    assert len(batches) == len(ds)
    sizes = sorted(len(labels) for _, labels in batches)
    assert sizes == [1, 8, 8, 8, 8, 8]
    for images, labels in batches:
        assert images.dtype == torch.uint8 and images.is_contiguous()
        assert tuple(images.shape[1:]) == (3, 64, 64) and labels.dtype == torch.int64
    # the same samples as unbatched reading, in the same order when read by one process
    flat = [(img, int(lab)) for images, labels in batches for img, lab in zip(images, labels)]
    plain = list(open_dataset(outputs["wds"], transform=T, decode=decode, stream=True))
    assert sorted(lab for _, lab in flat) == sorted(lab for _, lab in plain)
    if workers <= 1:
        for (a, la), (b, lb) in zip(flat, plain):
            assert la == lb and torch.equal(a, b)


def test_wds_batches_across_ranks_are_whole_and_disjoint(torch, outputs):
    seen = []
    for rank in range(2):
        ds = open_dataset(outputs["wds"], transform=RandomResizedCropToTensor(32), decode="fused",
                          batch_size=4, rank=rank, world_size=2, even="pad")
        batches = list(ds)
        assert len(batches) == len(ds) == 6  # 21 samples per rank: 5 of 4 and one of 1
        seen.extend(int(x) for _, labels in batches for x in labels)
    assert len(seen) == 42  # 41 and one padded


def test_encoded_batches_keep_the_bytes_as_a_list(torch, outputs):
    (images, labels), *_ = list(open_dataset(outputs["wds"], decode="raw", batch_size=5))
    assert isinstance(images, list) and all(isinstance(b, bytes) for b in images) and len(labels) == 5


def test_batch_size_must_be_positive(outputs):
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="batch_size"):
            open_dataset(outputs["wds"], batch_size=bad)


def test_the_dataloader_fetches_map_style_batches_with_one_call(torch, outputs, monkeypatch):
    from torch.utils.data import DataLoader

    ds = open_dataset(outputs["npy"], transform=CropToTensor(64, resize=72), decode="fused")
    calls = []
    real = type(ds).__getitems__

    def spy(self, indices):
        calls.append(list(indices))
        return real(self, indices)

    monkeypatch.setattr(type(ds), "__getitems__", spy)
    batches = list(DataLoader(ds, batch_size=16, num_workers=0))
    assert [len(c) for c in calls] == [16, 16, 9]
    assert sum(len(labels) for _, labels in batches) == 41
    assert batches[0][0].shape == (16, 3, 64, 64)
    expected = [ds[i] for i in range(16)]
    assert all(torch.equal(a, b[0]) for a, b in zip(batches[0][0], expected))


def test_dict_samples_with_different_fields_are_refused_as_a_batch_in_one_line(tmp_path, photos):
    import json
    import os

    from conftest import encode, write

    src = str(tmp_path / "flat")
    for i in range(6):
        write(os.path.join(src, f"s{i}.jpg"), encode(photos["rocket"].resize((16, 12))))
        if i % 2:
            write(os.path.join(src, f"s{i}.json"), json.dumps({"i": i}).encode())
    out = str(tmp_path / "out")
    convert(src, out, workers=1)
    with pytest.raises(ValueError, match="hold different fields") as err:
        list(open_dataset(out, decode="raw", batch_size=3))
    assert "\n" not in str(err.value)
    assert len(list(open_dataset(out, decode="raw"))) == 6  # one by one they read
