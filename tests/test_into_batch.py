"""decode="fused" batches decoded straight into one tensor (dsconvert.readers.into_batch).

The batch a DataLoader gives must be the one the per-sample path gives (same seed, same
crops, flips and labels, workers included); default_collate must hand the tensor on without a
copy; anything else a user does with the samples must see ordinary (tensor, label) tuples."""

from __future__ import annotations

import pytest

from dsconvert import convert, open_dataset
from dsconvert.readers.map import MapDataset

from conftest import make_image_folder

pytestmark = pytest.mark.usefixtures("torch")


@pytest.fixture(scope="module")
def output(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("into_batch")
    make_image_folder(str(root / "photos"), photos, {"a": 10, "b": 10, "c": 4}, size=(300, 220))
    convert(str(root / "photos"), str(root / "wds"), samples_per_shard=7)
    return str(root / "wds")


def transforms():
    import torchvision.transforms as T

    return {"train": T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.PILToTensor()]),
            "eval": T.Compose([T.Resize(110), T.CenterCrop(96), T.PILToTensor()]),
            "flip always": T.Compose([T.RandomResizedCrop(64, scale=(0.5, 1.0)), T.RandomHorizontalFlip(1.0),
                                      T.PILToTensor()])}


def per_sample(monkeypatch):
    """The path before: every sample its own tensor, stacked by default_collate."""
    monkeypatch.setattr(MapDataset, "_batch_shape", lambda self: None)


def loader_batches(torch, ds, workers):
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, batch_size=5, shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(3))
    return [(images.clone(), labels.clone()) for images, labels in loader]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", ["train", "eval", "flip always"])
def test_the_dataloader_gives_the_per_sample_paths_batches(torch, output, monkeypatch, name, workers):
    ds = open_dataset(output, transform=transforms()[name], decode="fused")
    torch.manual_seed(0)
    got = loader_batches(torch, ds, workers)
    with monkeypatch.context() as m:
        per_sample(m)
        torch.manual_seed(0)
        want = loader_batches(torch, ds, workers)
    assert len(got) == len(want) == 5 and sum(len(labels) for _, labels in got) == 24
    for (images, labels), (images_before, labels_before) in zip(got, want):
        assert images.dtype == torch.uint8 and labels.dtype == labels_before.dtype == torch.int64
        assert torch.equal(labels, labels_before)
        assert torch.equal(images, images_before)  # same boxes, flips and pixels


def test_default_collate_hands_the_batch_on_without_a_copy(torch, output):
    from torch.utils.data import DataLoader, default_collate

    ds = open_dataset(output, transform=transforms()["train"], decode="fused")
    rows = ds.__getitems__([3, 1, 4, 1, 5])
    images, labels = default_collate(rows)
    assert images is rows.images and tuple(images.shape) == (5, 3, 96, 96)
    assert labels.tolist() == [ds[i][1] for i in (3, 1, 4, 1, 5)]
    for images, _ in DataLoader(ds, batch_size=8, num_workers=1):
        assert images.is_shared()  # written in the worker's shared memory: no copy on the way


def test_a_users_collate_sees_plain_samples_and_a_changed_list_is_stacked(torch, output):
    from torch.utils.data import DataLoader, default_collate

    ds = open_dataset(output, transform=transforms()["eval"], decode="fused")
    rows = ds.__getitems__([0, 7, 14, 21])
    for (image, label), i in zip(rows, [0, 7, 14, 21]):
        assert isinstance(image, torch.Tensor) and torch.equal(image, ds[i][0]) and label == ds[i][1]
    reordered = list(reversed(rows))
    images, labels = default_collate(reordered)
    assert images is not rows.images and torch.equal(images, rows.images.flip(0))
    assert labels.tolist() == [ds[i][1] for i in (21, 14, 7, 0)]
    rows.pop()  # the returned list, changed: stacked as tuples, not handed on
    images, _ = default_collate(rows)
    assert tuple(images.shape) == (3, 3, 96, 96) and torch.equal(images, rows.images[:3])

    seen = []

    def mine(samples):
        seen.append([(type(image), tuple(image.shape), type(label)) for image, label in samples])
        return len(samples)

    assert sum(DataLoader(ds, batch_size=6, collate_fn=mine)) == 24
    assert all(s == (torch.Tensor, (3, 96, 96), int) for batch in seen for s in batch)


def test_batches_fetched_at_once_and_target_transforms_are_the_same(torch, output, monkeypatch):
    T = transforms()["train"]
    fetched = open_dataset(output, transform=T, decode="fused", target_transform=lambda y: y * 10, prefetch=True)
    assert fetched._fetches()
    torch.manual_seed(1)
    a = fetched.__getitems__([2, 9, 16, 23])
    torch.manual_seed(1)
    b = [fetched[i] for i in (2, 9, 16, 23)]
    assert torch.equal(a.images, torch.stack([image for image, _ in b]))
    assert a.labels == [label for _, label in b] and all(label % 10 == 0 for label in a.labels)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("name", ["train", "eval"])
def test_the_streams_batches_built_in_the_worker_are_the_per_sample_ones(torch, output, monkeypatch, name, workers):
    """stream=True with batch_size= decodes each batch into one tensor: the same batches (and
    target transform, and short last batch) as decoding each sample and collating them."""
    from torch.utils.data import DataLoader

    from dsconvert.fused import FusedTransform

    def batches():
        ds = open_dataset(output, transform=transforms()[name], decode="fused", stream=True, batch_size=5,
                          target_transform=lambda y: y + 100)
        torch.manual_seed(4)
        return [(images.clone(), labels.clone()) for images, labels in DataLoader(ds, batch_size=None,
                                                                                   num_workers=workers)]

    got = batches()
    with monkeypatch.context() as m:  # the path before: each sample decoded, then collated
        m.setattr(FusedTransform, "batch_shape", property(lambda self: None))
        want = batches()
    assert [len(labels) for _, labels in got] == [len(labels) for _, labels in want]
    assert sum(len(labels) for _, labels in got) == 24 and all(labels.min() >= 100 for _, labels in got)
    for (images, labels), (images_before, labels_before) in zip(got, want):
        assert images.dtype == torch.uint8 and torch.equal(labels, labels_before)
        assert torch.equal(images, images_before)


def test_a_transform_with_steps_after_the_tensor_is_not_batched(torch, output):
    import torchvision.transforms as T

    ds = open_dataset(output, transform=T.Compose([T.RandomResizedCrop(64), T.PILToTensor(),
                                                   T.ConvertImageDtype(torch.float32)]), decode="fused")
    assert ds.fused.batch_shape is None
    rows = ds.__getitems__([0, 1])
    assert type(rows) is list and rows[0][0].dtype == torch.float32


def test_a_workers_batch_is_written_without_a_page_fault_a_page(torch):
    """The batch's shared pages are made present in one call: writing all of a 64 x 3 x 224 x
    224 batch (2,352 pages) then takes almost no page fault, where each page's first write
    faulted before."""
    import resource

    from dsconvert.readers import into_batch

    def faults_writing(populate: bool) -> int:
        empty = torch.empty(0, dtype=torch.uint8)
        size = 64 * 3 * 224 * 224
        batch = empty.new(empty._typed_storage()._new_shared(size, device=empty.device))
        if populate and not into_batch._populate(batch.data_ptr(), size):
            pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux 5.14+)")
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        batch.fill_(1)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    assert faults_writing(False) > 2000
    assert faults_writing(True) < 100


def test_a_centre_crops_per_size_plan_gives_the_general_ways_pixels(torch, photos, image_kinds, monkeypatch):
    """Resize + CenterCrop looks up what depends on the image's size once per size
    (FusedTransform._centre_into): the same pixels and flips as the general way, for every kind
    of image, restart-marked, enlarged, reduced at decode (which goes the general way), twice."""
    import numpy as np
    import torchvision.transforms as T

    from dsconvert.codecs import restart_marked
    from dsconvert.fused import FusedTransform, fuse

    from conftest import encode

    big = encode(photos["astronaut"].resize((640, 520)), quality=90)  # reduced at decode: 1/2
    samples = [data for _, data in image_kinds.values()] + [big, restart_marked(image_kinds["baseline"][1])]
    for ops in ([T.Resize(80), T.CenterCrop(64)], [T.Resize(80), T.CenterCrop(64), T.RandomHorizontalFlip()],
                [T.Resize((90, 70), interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop((60, 50))]):
        fused = fuse(T.Compose(ops + [T.PILToTensor()]))
        shape = fused.batch_shape
        for data in samples * 2:
            got, want = np.zeros(shape, np.uint8), np.ones(shape, np.uint8)
            torch.manual_seed(1)
            fused.into(data, got)
            after = torch.rand(1)
            with monkeypatch.context() as m:
                m.setattr(FusedTransform, "_centre_into", lambda self, data, out: False)
                torch.manual_seed(1)
                fused.into(data, want)
            assert np.array_equal(got, want) and torch.equal(after, torch.rand(1))  # same pixels, same draws
        plans = list(fused._centre_plans.values())
        assert len(plans) <= len(samples) and () in plans and any(plans)  # per size: the big one went the general way
