"""Epochs advance by themselves, ranks are equal by default, and a transform decode="fused"
cannot fold is named once."""

import warnings

import pytest

from dsconvert import convert, open_dataset
from dsconvert.data import ResumableSampler

from conftest import make_image_folder

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402


@pytest.fixture(scope="module")
def out(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("epochs")
    src = str(root / "src")
    make_image_folder(src, photos, {"a": 11, "b": 10}, size=(16, 16))
    out = str(root / "out")
    convert(src, out, samples_per_shard=4, workers=1)  # 21 samples, 6 shards
    return out


def _digests(loader):
    import hashlib

    return [hashlib.sha1(bytes(raw)).hexdigest() for raw, _ in loader]


@pytest.mark.parametrize("workers, persistent", [(0, False), (2, False), (2, True)])
def test_a_stream_reshuffles_each_epoch_without_set_epoch(out, workers, persistent):
    ds = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=persistent)
    epochs = [_digests(loader) for _ in range(3)]
    assert all(sorted(e) == sorted(epochs[0]) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]
    # each is the epoch set_epoch names, read by a fresh dataset
    for e, got in enumerate(epochs):
        fresh = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
        fresh.set_epoch(e)
        assert _digests(DataLoader(fresh, batch_size=None, num_workers=workers)) == got
    assert ds.epoch == 2


def test_set_epoch_wins_over_the_count(out):
    ds = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
    first = _digests(ds)
    _digests(ds)
    ds.set_epoch(0)
    assert _digests(ds) == first  # set_epoch(0) again reads epoch 0 again
    ds.set_epoch(7)
    seven = _digests(ds)
    assert _digests(ds) != seven  # ... and the next iteration without it reads epoch 8


def test_a_resume_then_the_next_epoch(out):
    ds = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
    whole = [_digests(ds) for _ in range(2)]
    resumed = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
    resumed.load_state_dict({"epoch": 0, "samples_seen": 8})
    assert _digests(resumed) == whole[0][8:]
    assert _digests(resumed) == whole[1]


def test_the_sampler_reshuffles_each_epoch_without_set_epoch():
    sampler = ResumableSampler(50, seed=1)
    a, b = list(sampler), list(sampler)
    assert sorted(a) == sorted(b) == list(range(50)) and a != b
    sampler.set_epoch(0)
    assert list(sampler) == a
    other = ResumableSampler(50, seed=1)
    other.set_epoch(1)
    assert list(other) == b


@pytest.mark.parametrize("n", [20, 21, 22, 23])
def test_ranks_take_equal_samples_by_default(out, n):
    from dsconvert.readers.sampler import ResumableSampler as Sampler

    lengths = [len(open_dataset(out, decode="raw", rank=r, world_size=4)) for r in range(4)]
    assert len(set(lengths)) == 1 and lengths[0] == 6  # 21 samples over 4 ranks, padded
    per_rank = [list(Sampler(n, rank=r, world_size=4)) for r in range(4)]
    assert len({len(p) for p in per_rank}) == 1 and set().union(*per_rank) == set(range(n))
    exact = [len(open_dataset(out, decode="raw", rank=r, world_size=4, even=None)) for r in range(4)]
    assert sum(exact) == 21


def test_a_stream_by_rank_reads_every_sample_with_equal_steps(out):
    got = [_digests(open_dataset(out, decode="raw", rank=r, world_size=2)) for r in range(2)]
    assert len(got[0]) == len(got[1]) == 11
    everything = _digests(open_dataset(out, decode="raw", stream=True))
    assert set(got[0]) | set(got[1]) == set(everything)


def test_fused_names_the_step_it_could_not_fold_once(out):
    transforms = pytest.importorskip("torchvision.transforms")
    unfoldable = transforms.Compose([transforms.RandomVerticalFlip(), transforms.RandomResizedCrop(8),
                                     transforms.PILToTensor()])
    with pytest.warns(UserWarning, match="RandomVerticalFlip") as caught:
        ds = open_dataset(out, transform=unfoldable, decode="fused")
        batches = list(DataLoader(ds, batch_size=4, num_workers=2))
    assert len(batches) == 6 and batches[0][0].shape == (4, 3, 8, 8)
    assert sum("decode='fused'" in str(w.message) for w in caught) == 1
    v2 = pytest.importorskip("torchvision.transforms.v2")
    with pytest.warns(UserWarning, match=r"Resize\(antialias=False\)"):
        open_dataset(out, transform=v2.Compose([v2.ToImage(), v2.Resize(8, antialias=False)]), decode="fused")
    foldable = transforms.Compose([transforms.RandomResizedCrop(8), transforms.PILToTensor()])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        open_dataset(out, transform=foldable, decode="fused")


@pytest.mark.slow
def test_analyze_names_the_step_fused_decoding_could_not_fold(tmp_path, photos, monkeypatch):
    pytest.importorskip("torchvision.transforms")
    from dsconvert.analyze import analyze

    (tmp_path / "usertf.py").write_text(
        "import torchvision.transforms as T\n"
        "flipped_first = T.Compose([T.RandomVerticalFlip(), T.RandomResizedCrop(32), T.PILToTensor()])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 6, "b": 6}, size=(64, 48))
    report = analyze(src, sample=12, sweep_levels=[1], transform="usertf:flipped_first", pass_seconds=0.5)
    notes = [n for n in report["verdict"]["notes"] if 'decode="fused" not measured' in n]
    assert len(notes) == 1 and "RandomVerticalFlip" in notes[0]
    assert not any("fused" in name for name in report["loader"]["passes"])


def test_epochs_stay_whole_when_the_worker_count_changes_or_a_peek_comes_first(out):
    """A rank's iterations come in rounds, one per loader iteration whatever its worker count:
    a peek with next(iter(ds)) or a loader with other workers must not put workers of one
    epoch in different epochs (samples read twice, others not at all)."""
    ds = open_dataset(out, decode="raw", shuffle=True, seed=5, buffer_size=4)
    everything = sorted(_digests(open_dataset(out, decode="raw", stream=True)))
    next(iter(ds))  # epoch 0, a round of one
    epochs = []
    for workers in (2, 3, 1, 2):
        got = _digests(DataLoader(ds, batch_size=None, num_workers=workers))
        assert sorted(got) == everything, workers
        epochs.append(got)
    assert ds.epoch == 4 and len({tuple(e) for e in epochs}) == 4
