"""Mixing and sampling (issue 35, item 4): weighted mixtures of real outputs (by samples and by
epochs), subsamples and infinite resampling, deterministic from a seed, map-style and
streaming, dealt over ranks and DataLoader workers, resumable; and docs/mixing.md's blocks,
run as written."""

import collections
import fractions
import hashlib
import itertools
import os
import pickle
import re
import sys

import numpy as np
import pytest

from dsconvert import OptionError, convert, mix, open_dataset, subsample
from dsconvert.data import ResumableSampler
from dsconvert.readers.mix_draws import FeistelPermutation, Mixture, apportion

from conftest import ROOT, make_image_folder

SOURCES = {"a": ({"x": 12, "y": 8}, 0), "b": ({"x": 6, "y": 6}, 1), "c": ({"z": 7}, 2)}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, photos):
    """Three small wds outputs converted from real JPEGs, each sample's bytes its own."""
    base = tmp_path_factory.mktemp("mix")
    out = {}
    for name, (classes, seed) in SOURCES.items():
        src = str(base / f"src-{name}")
        make_image_folder(src, photos, classes, seed=seed, size=(32, 24))
        convert(src, str(base / name), "wds", samples_per_shard=5, workers=1)
        out[name] = str(base / name)
    return out


def opened(outputs, *names):
    return [open_dataset(outputs[n], decode="raw") for n in names]


def sha(sample):
    return hashlib.sha1(bytes(sample[0])).hexdigest()


def owners(datasets):
    """sha1 of a sample's bytes -> (source, index in it)."""
    own = {sha(ds[i]): (k, i) for k, ds in enumerate(datasets) for i in range(len(ds))}
    assert len(own) == sum(len(ds) for ds in datasets)  # every sample tells its source
    return own


def test_proportions_within_2_percent_over_10000_draws(outputs, torch):
    datasets = opened(outputs, "a", "b")
    own = owners(datasets)
    train = mix(datasets, weights=[0.7, 0.3], length=10_000, seed=0)
    loader = torch.utils.data.DataLoader(train, batch_size=100, shuffle=True, num_workers=2, collate_fn=list,
                                         generator=torch.Generator().manual_seed(0))
    drawn = [own[sha(s)][0] for batch in loader for s in batch]
    counts = np.bincount(drawn, minlength=2)
    assert len(drawn) == 10_000 and list(counts) == [7000, 3000]  # exact over an epoch
    assert abs(np.mean(np.asarray(drawn[:1000]) == 0) - 0.7) < 0.05  # the shuffled first tenth, near them
    sequential = [own[sha(train[i])][0] for i in range(500)]  # even in index order, any prefix holds them
    for end in range(1, 501):
        assert abs(sequential[:end].count(0) - 0.7 * end) <= 1

    streams = opened(outputs, "a", "b", "c")  # infinite, three sources, two workers
    own = owners(streams)
    endless = mix(streams, weights=[0.5, 0.3, 0.2], seed=1, infinite=True)
    loader = torch.utils.data.DataLoader(endless, batch_size=50, num_workers=2, collate_fn=list)
    drawn = [own[sha(s)][0] for batch in itertools.islice(loader, 200) for s in batch]
    assert len(drawn) == 10_000
    for k, weight in enumerate([0.5, 0.3, 0.2]):
        assert abs(drawn.count(k) / len(drawn) - weight) < 0.02
    with pytest.raises(TypeError, match="no length"):
        len(endless)

    iid = mix(datasets, weights=[0.7, 0.3], length=10_000, seed=2, replacement=True)
    picks = collections.Counter(own_of for own_of in (iid.source_of(i) for i in range(10_000)))
    assert sum(n for (s, _), n in picks.items() if s == 0) == 7000
    assert len({i for s, i in picks if s == 1}) == len(datasets[1])  # 3000 draws of 12 reach each


def test_weights_by_epochs_and_the_next_part_each_epoch(outputs):
    a, b = opened(outputs, "a", "b")
    own = owners([a, b])
    train = mix([a, b], epochs=[2, 0.5], seed=0)
    assert len(train) == 2 * len(a) + len(b) // 2
    first = collections.Counter(own[sha(s)] for s in train.__getitems__(list(range(len(train)))))
    assert all(first[(0, i)] == 2 for i in range(len(a)))  # every sample of a twice
    half = {i for s, i in first if s == 1}
    assert len(half) == 6 and all(first[(1, i)] == 1 for i in half)
    train.set_epoch(1)
    second = {own[sha(train[i])] for i in range(len(train))}
    assert {i for s, i in second if s == 1} == set(range(len(b))) - half  # the other half, none twice
    train.set_epoch(0)
    assert collections.Counter(own[sha(train[i])] for i in range(len(train))) == first


def test_deterministic_from_the_seed(outputs):
    datasets = opened(outputs, "a", "b", "c")
    one = mix(datasets, weights=[2, 1, 1], length=300, seed=7)
    again = pickle.loads(pickle.dumps(mix(datasets, weights=[2, 1, 1], length=300, seed=7)))
    other = mix(datasets, weights=[2, 1, 1], length=300, seed=8)
    where = [one.source_of(i) for i in range(300)]
    assert where == [again.source_of(i) for i in range(300)]
    assert [sha(one[i]) for i in range(0, 300, 7)] == [sha(again[i]) for i in range(0, 300, 7)]
    assert where != [other.source_of(i) for i in range(300)]
    assert [s for s, _ in where] == [s for s, _ in (other.source_of(i) for i in range(300))]  # the same spread
    assert one.identity == again.identity != other.identity


def test_subsample(outputs):
    (a,) = opened(outputs, "a")
    own = owners([a])
    half = subsample(a, 0.5, seed=3)
    picked = [own[sha(half[i])][1] for i in range(len(half))]
    assert len(half) == 10 and len(set(picked)) == 10
    assert picked == [own[sha(s)][1] for s in subsample(a, 10, seed=3).__getitems__(list(range(10)))]
    assert picked != [own[sha(subsample(a, 0.5, seed=4)[i])][1] for i in range(10)]
    half.set_epoch(1)  # the next part of the seeded order: the other half
    assert {own[sha(half[i])][1] for i in range(10)} == set(range(20)) - set(picked)
    assert len(subsample(a, np.int64(4))) == 4 and len(mix([a], length=np.int64(9), weights=[np.float32(1)])) == 9
    many = subsample(a, 50, seed=0, replacement=True)
    assert len(many) == 50 and len({sha(many[i]) for i in range(50)}) < 20 + 1
    with pytest.raises(OptionError, match="without replacement"):
        subsample(a, 21)
    for size in (0, 1.5, -0.1, "10"):
        with pytest.raises(OptionError):
            subsample(a, size)


def test_a_map_style_mixture_resumes_through_its_sampler(outputs):
    train = mix(opened(outputs, "a", "b"), weights=[0.6, 0.4], length=60, seed=0)
    whole = list(ResumableSampler(train, seed=5))
    sampler = ResumableSampler(train, seed=5)
    head = list(itertools.islice(iter(sampler), 25))
    state = sampler.state_dict()
    resumed = ResumableSampler(train, seed=5)
    resumed.load_state_dict(state)
    assert head + list(resumed) == whole
    assert [sha(train[i]) for i in whole] == [sha(s) for s in train.__getitems__(whole)]


def test_a_stream_is_dealt_over_ranks_and_workers(outputs, torch):
    datasets = opened(outputs, "a", "b", "c")
    epoch = mix(datasets, weights=[0.5, 0.3, 0.2], length=90, seed=0)
    want = collections.Counter(sha(epoch[i]) for i in range(len(epoch)))
    got = collections.Counter()
    for rank in range(2):
        stream = mix(datasets, weights=[0.5, 0.3, 0.2], length=90, seed=0, stream=True, rank=rank,
                     world_size=2, even=None)
        assert len(stream) == 45
        loader = torch.utils.data.DataLoader(stream, batch_size=4, num_workers=2, collate_fn=list)
        got.update(sha(s) for batch in loader for s in batch)
    assert got == want  # every draw of the epoch once, over 2 ranks x 2 workers
    stream = mix(datasets, weights=[0.5, 0.3, 0.2], length=90, seed=0, stream=True)
    assert [sha(s) for s in stream] == [sha(epoch[i]) for i in range(90)]  # one rank, one worker: in order
    epoch.set_epoch(1)
    assert [sha(s) for s in stream] == [sha(epoch[i]) for i in range(90)]  # the next iteration: epoch 1's draws


def test_a_stream_resumes_exactly(outputs):
    datasets = opened(outputs, "a", "b")
    args = dict(weights=[0.7, 0.3], length=40, seed=0, infinite=True)
    run = iter(mix(datasets, **args))
    whole = [sha(next(run)) for _ in range(100)]  # two and a half epochs
    stream = mix(datasets, **args)
    it = iter(stream)
    head = [sha(next(it)) for _ in range(55)]
    saved = stream.state_dict()  # a worker's place (no workers: this process's)
    assert saved["epoch"] == 1 and saved["yielded"] == 15
    again = mix(datasets, **args)
    again.load_state_dict(saved)
    it = iter(again)
    assert head + [sha(next(it)) for _ in range(45)] == whole
    elastic = mix(datasets, **args)
    elastic.load_state_dict({"epoch": 1, "samples_seen": 15})
    it = iter(elastic)
    assert [sha(next(it)) for _ in range(45)] == whole[55:]
    with pytest.raises(ValueError, match="another dataset"):
        mix(datasets, **dict(args, seed=1)).load_state_dict(saved)


def test_a_stream_resumes_in_a_stateful_dataloader(outputs):
    StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader
    datasets = opened(outputs, "a", "b", "c")
    args = dict(weights=[0.5, 0.25, 0.25], seed=0, infinite=True)

    def loader():
        return StatefulDataLoader(mix(datasets, **args), batch_size=3, num_workers=2, collate_fn=list)

    whole = [[sha(s) for s in batch] for batch in itertools.islice(loader(), 40)]
    first = loader()
    steps = iter(first)
    head = [[sha(s) for s in next(steps)] for _ in range(17)]
    saved = first.state_dict()
    del steps
    second = loader()
    second.load_state_dict(saved)
    assert head + [[sha(s) for s in batch] for batch in itertools.islice(second, 23)] == whole


def test_bad_mixtures_are_refused_in_one_line(outputs):
    a, b = opened(outputs, "a", "b")
    for kwargs, words in ((dict(weights=[1, 1], epochs=[1, 1]), "not both"),
                          (dict(weights=[1]), "one value per dataset"),
                          (dict(weights=[1, -1]), ">= 0"),
                          (dict(weights=[0, 0]), "not all 0"),
                          (dict(epochs=[1, 1], length=5), "leave length"),
                          (dict(length=0), "positive int"),
                          (dict(rank=1), "stream=True")):
        with pytest.raises(OptionError, match=words):
            mix([a, b], **kwargs)
    stream = open_dataset(outputs["a"], decode="raw", stream=True)
    with pytest.raises(OptionError, match="not map-style"):
        mix([a, stream])
    with pytest.raises(OptionError, match="at least one"):
        mix([])
    with pytest.raises(OptionError, match="empty"):
        mix([[], []])
    with pytest.raises(OptionError, match="empty source"):
        mix([a, []], weights=[1, 1])


NUMBERS = [0, 1, 2, 0.5, 5e-324, 1e-300, 1e300, 1e308, sys.float_info.max, 10 ** 400, 2 ** 62, 2 ** 63,
           float("inf"), float("-inf"), float("nan"), -1, -0.0, -5e-324, np.float32(3e38), np.float64(1e308),
           np.int64(2 ** 62), np.uint64(2 ** 64 - 1), fractions.Fraction(1, 3), True, "1", None, 1 + 0j]


def test_any_numbers_make_a_mixture_or_one_line_option_error(torch):
    """Issue 40, item 10, the whole class: weights, epochs, length and subsample sizes from
    zero to 10**400, subnormals, infinities, NaN, numpy scalars and non-numbers, in every pair:
    each makes a mixture whose len, first and last sample, and stream length all work, or is
    refused with a one-line OptionError, never numpy's ValueError or an OverflowError."""
    a, b = list(range(10)), list(range(7))

    def check(sub=(), **args):
        try:
            sources = [subsample(a, *sub)] if sub else [a, b]
            m = mix(sources, **args)
        except OptionError as exc:
            assert "\n" not in str(exc)
            return "refused"
        n = len(m)
        assert 1 <= n <= 2 ** 62 and m[0] in a + b and m[n - 1] in a + b and m[-1] == m[n - 1]
        assert len(mix(sources, stream=True, **args)) == n
        return "made"

    seen = collections.Counter()
    for x, y in itertools.product(NUMBERS, repeat=2):
        seen[check(weights=[x, y])] += 1
        seen[check(epochs=[x, y])] += 1
    for x in NUMBERS:
        seen[check(length=x)] += 1
        seen[check(weights=[x, 1], length=2 ** 62)] += 1
        for replacement in (False, True):
            seen[check((x, 0, replacement))] += 1
    assert seen["made"] > 200 and seen["refused"] > 200, seen
    assert mix([a, b], weights=[1e308, 1e308]).mixture.counts == [9, 8]  # shares, whatever their scale
    assert mix([a, b], weights=[10 ** 400, 10 ** 399], length=11).mixture.counts == [10, 1]


def test_the_arithmetic():
    for n in (1, 2, 3, 7, 64, 1000, 4097):
        assert sorted(FeistelPermutation(n, 0, "k")(np.arange(n)).tolist()) == list(range(n))  # a permutation
    assert apportion(10, [0.7, 0.3]) == [7, 3] and apportion(7, [1, 1, 1]) == [3, 2, 2]
    m = Mixture([50, 30, 20], [70, 20, 10])
    source, j = m.interleave(np.arange(100))
    for s in range(3):  # each source's draws in order, once each
        assert j[source == s].tolist() == list(range(m.counts[s]))
    big = Mixture([3, 5], [1 << 31, (1 << 31) + 7])  # past int64's reach for 2 c x: exact still
    assert big.interleave(np.array([0, 1, big.length - 1]))[0].tolist() == [1, 0, 1]
    for mixture in (m, big, Mixture([1, 5, 9, 2], [3, 0, 40, 7], seed=3, replacement=True)):
        positions = np.unique(np.r_[0:min(mixture.length, 60), mixture.length - 1])
        for round_ in (0, 1, 5):  # one position at a time (ds[i]) as in batches (__getitems__)
            source, sample = mixture.locate(round_, positions)
            expect = list(zip(source.tolist(), sample.tolist()))
            assert [mixture.locate_one(round_, int(p)) for p in positions] == expect


def python_blocks():
    text = open(os.path.join(ROOT, "docs", "mixing.md"), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_docs_run_as_written(outputs):
    pytest.importorskip("torchvision")
    pytest.importorskip("torchdata")
    blocks = python_blocks()
    assert len(blocks) == 4
    for block in blocks:
        block = block.replace("/ssd/web-wds", outputs["a"]).replace("/ssd/curated-wds", outputs["b"])
        exec(compile(block, "docs/mixing.md", "exec"), {"__name__": "__docs__"})


def test_set_epoch_reaches_persistent_workers(outputs, torch):
    (a,) = opened(outputs, "a")
    quarter = subsample(a, 5, seed=0)
    loader = torch.utils.data.DataLoader(quarter, batch_size=5, num_workers=2, persistent_workers=True,
                                         collate_fn=list)
    seen = set()
    for epoch in range(4):
        quarter.set_epoch(epoch)  # in this process; the workers were started in epoch 0
        want = [sha(quarter[i]) for i in range(5)]
        assert [sha(s) for batch in loader for s in batch] == want
        seen.update(want)
    assert len(seen) == len(a)  # four epochs of a quarter: every sample once


class EpochTagged:
    """A foreign map-style source with its own ``set_epoch``: each sample says the epoch its
    copy of the dataset was told."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return ("tagged", i, self.epoch)

    def set_epoch(self, epoch):
        self.epoch = epoch


def test_a_mixture_reads_its_sources_at_its_epoch(outputs, torch):
    """Issue 40, item 4, the whole class: whether the epoch is set (map-style, also in
    persistent DataLoader workers) or advances by itself (a finite stream iterated again, an
    infinite one), at any depth of nesting, a subsample mixed in reads the samples it reads
    alone in that epoch (so four epochs of a quarter cover the source), and a foreign source
    with ``set_epoch`` is told the epoch."""
    a, b = opened(outputs, "a", "b")
    alone = subsample(a, 5, seed=0)

    def quarter(epoch):
        alone.set_epoch(epoch)
        return sorted(sha(alone[i]) for i in range(5))

    theirs = {sha(a[i]) for i in range(len(a))}

    def of_a(samples):
        return sorted(sha(s) for s in samples if sha(s) in theirs)

    wanted = [quarter(e) for e in range(4)]
    assert len(set().union(*wanted)) == len(a)
    for make in (lambda **kw: mix([subsample(a, 5, seed=0), b], seed=1, **kw),
                 lambda **kw: mix([mix([subsample(a, 5, seed=0)], seed=2), b], seed=1, **kw)):
        m = make()
        loader = torch.utils.data.DataLoader(m, batch_size=7, num_workers=2, persistent_workers=True,
                                             collate_fn=list)
        for epoch in range(4):
            m.set_epoch(epoch)
            assert of_a(m[i] for i in range(len(m))) == of_a(m.__getitems__(list(range(len(m))))) == wanted[epoch]
            assert of_a(s for batch in loader for s in batch) == wanted[epoch]  # workers started in epoch 0
        stream = make(stream=True)
        for epoch in range(4):  # each iteration the next epoch, by itself
            assert of_a(stream) == wanted[epoch]
        endless = iter(make(infinite=True))
        for epoch in range(4):
            assert of_a(next(endless) for _ in range(len(m))) == wanted[epoch]
        endless = torch.utils.data.DataLoader(make(infinite=True), batch_size=None, num_workers=2)
        read = set(of_a(itertools.islice(endless, 5 * len(m))))
        assert read == theirs  # two workers moving on by themselves: every sample of a within 5 epochs

    tagged = mix([EpochTagged(6), b], seed=3)
    tagged.set_epoch(7)
    assert {s[2] for s in (tagged[i] for i in range(len(tagged))) if s[0] == "tagged"} == {7}
    stream = mix([EpochTagged(6), b], seed=3, stream=True)
    for epoch in range(3):
        assert {s[2] for s in stream if s[0] == "tagged"} == {epoch}
