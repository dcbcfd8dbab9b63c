"""Training-quality order: on a class-sorted source, every read mode puts about as many classes
in a batch as a uniform shuffle does (issue 32's bound: at least 0.9x), measured on a real
conversion and by the order arithmetic at ImageNet's shape."""


import numpy as np
import pytest

from dsconvert import convert, open_dataset
from dsconvert.readers.order import epoch_order
from dsconvert.shuffle import shuffled_order

from conftest import encode

BATCH = 256


def uniform_classes_per_batch(class_sizes, batch=BATCH):
    """Expected distinct classes in ``batch`` samples drawn without replacement from classes
    of these sizes (a uniform permutation's batch)."""
    n = sum(class_sizes)
    t = np.arange(batch)
    return float(sum(1 - np.prod((n - c - t) / (n - t)) for c in class_sizes))


def classes_per_batch(labels, batch=BATCH):
    """Mean distinct labels over the whole batches of ``labels``, in order."""
    labels = np.asarray(labels)
    whole = labels[: len(labels) // batch * batch].reshape(-1, batch)
    ordered = np.sort(whole, axis=1)
    return float(np.mean((np.diff(ordered, axis=1) != 0).sum(axis=1) + 1))


def test_the_measure_against_a_uniform_permutation():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(1000), 20)
    uniform = uniform_classes_per_batch([20] * 1000)
    assert 226 < uniform < 228  # (226.1 with replacement)
    assert abs(classes_per_batch(rng.permutation(labels)) - uniform) < 2
    assert classes_per_batch(labels) < 15  # class-sorted: a batch spans about 13 classes


@pytest.fixture(scope="module")
def thousand_classes(tmp_path_factory):
    """1,000 classes x 20 tiny JPEGs, class-sorted as ImageFolder reads them, converted with
    the defaults (shuffled order) and with --order source."""
    root = tmp_path_factory.mktemp("mixing")
    src = root / "src"
    from PIL import Image

    data = encode(Image.new("RGB", (8, 8), (120, 60, 30)), quality=90)
    for c in range(1000):
        folder = src / f"c{c:04d}"
        folder.mkdir(parents=True)
        for i in range(20):
            (folder / f"{i:02d}.jpg").write_bytes(data)
    shuffled, source = str(root / "shuffled"), str(root / "source")
    convert(str(src), shuffled, workers=2)
    convert(str(src), source, workers=2, order="source")
    return shuffled, source


def _labels(out, **options):
    return [label for _, label in open_dataset(out, decode="raw", **options)]


@pytest.mark.slow
def test_a_real_conversion_mixes_like_a_uniform_shuffle_in_every_read_mode(thousand_classes):
    import torch

    shuffled, source = thousand_classes
    uniform = uniform_classes_per_batch([20] * 1000)
    ds = open_dataset(shuffled, decode="raw")
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    modes = {
        "map-style, RandomSampler": [ds[i][1] for i in sampler],
        "stream, stored order": _labels(shuffled, stream=True),
        "stream, shuffle=True": _labels(shuffled, shuffle=True, seed=1),
    }
    for mode, labels in modes.items():
        assert sorted(labels) == sorted(np.repeat(np.arange(1000), 20).tolist()), mode
        assert classes_per_batch(labels) >= 0.9 * uniform, mode
    # the measure tells the old default apart: a buffer shuffle of class-sorted shards
    assert classes_per_batch(_labels(source, shuffle=True, seed=1)) < 0.5 * uniform


@pytest.mark.slow
@pytest.mark.parametrize("shuffle", [False, True])
def test_order_arithmetic_at_imagenet_shape(shuffle):
    classes, per_class, shard = 1000, 1281, 10000
    n = classes * per_class
    stored = np.asarray(shuffled_order(n, 0)) // per_class  # class of each stored position
    sizes = [shard] * (n // shard) + ([n % shard] if n % shard else [])
    starts = np.cumsum([0] + sizes[:-1])
    order = epoch_order(sizes, shuffle, 1000, 0, epoch=3)
    k, j = order.locate(np.arange(n, dtype=np.int64))
    labels = stored[starts[k] + j]
    assert classes_per_batch(labels) >= 0.9 * uniform_classes_per_batch([per_class] * classes)
    # the same reads over a source-ordered output: about 2 classes per batch
    source_labels = (starts[k] + j) // per_class
    assert classes_per_batch(source_labels) < 3 if shuffle else classes_per_batch(source_labels) < 2
