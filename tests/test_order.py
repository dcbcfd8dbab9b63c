"""The epoch's order and its dealing (dsconvert/readers/order.py), as arithmetic: every
remaining position exactly once over any topology, consumed as a prefix, located in O(1)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dsconvert.readers.order import Deal, GlobalOrder, remaining

from conftest import examples


def consumption(length, ranks, workers, chunk, run=None, batch=None):
    """Offsets in the order a DDP job with DataLoader workers consumes them: at step s every
    rank takes its s-th batch, which the DataLoader's round robin takes from worker s % workers
    (a worker with nothing left drops out of the round, as DataLoader does)."""
    per_rank = []
    for r in range(ranks):
        chunks = []
        for w in range(workers):
            d = Deal(length, ranks, r, workers, w, chunk, run)
            offs = d.offsets(0, d.length).tolist()
            b = batch or chunk  # the DataLoader's batch: the chunk when the dataset batches
            chunks.append([offs[i:i + b] for i in range(0, len(offs), b)])
        order, step = [], 0
        while any(chunks):
            # round robin over the workers still holding batches, from where it stood
            w = step % workers
            while not chunks[w]:
                w = (w + 1) % workers
            order.append(chunks[w].pop(0))
            step += 1
        per_rank.append(order)
    steps = max(len(o) for o in per_rank)
    return [[b for o in per_rank for b in (o[s:s + 1])] for s in range(steps)]


@settings(max_examples=examples(300), deadline=None)
@given(n=st.integers(0, 300), ranks=st.integers(1, 5), workers=st.integers(1, 4), chunk=st.integers(1, 9),
       seen=st.integers(0, 320), even=st.sampled_from([None, "pad", "drop"]))
def test_every_remaining_position_is_dealt_exactly_once(n, ranks, workers, chunk, seen, even):
    length = remaining(n, seen, ranks, even)
    got = []
    counts = []
    for r in range(ranks):
        deal_r = Deal(length, ranks, r, 1, 0, chunk)
        counts.append(deal_r.rank_length)
        for w in range(workers):
            d = Deal(length, ranks, r, workers, w, chunk)
            got += d.offsets(0, d.length).tolist()
            assert d.batches() == -(-d.length // chunk) or d.length == 0
    assert sorted(got) == list(range(length))
    assert max(counts) - min(counts) <= 1  # DDP: ranks take the same number of steps (to one sample)
    if even is not None:
        assert len(set(counts)) == 1 and length % ranks == 0
    if even == "drop":
        assert max(0, n - seen) - length < ranks
    if even == "pad":
        assert 0 <= length - max(0, n - seen) < ranks


@settings(max_examples=examples(300), deadline=None)
@given(n=st.integers(1, 300), ranks=st.integers(1, 4), workers=st.integers(1, 4), chunk=st.integers(1, 9))
def test_what_a_job_consumed_is_a_prefix_of_the_order(n, ranks, workers, chunk):
    """After s whole steps of every rank, the consumed offsets are exactly [0, s*ranks*chunk):
    so samples_seen alone says what is left, whatever the topology was."""
    steps = consumption(n, ranks, workers, chunk)
    consumed = []
    for s, batches in enumerate(steps):
        for b in batches:
            consumed += b
        if (s + 1) * ranks * chunk <= n and all(len(b) == chunk for b in batches) and len(batches) == ranks:
            assert sorted(consumed) == list(range((s + 1) * ranks * chunk))
    assert sorted(consumed) == list(range(n))


@settings(max_examples=examples(300), deadline=None)
@given(n=st.integers(0, 400), ranks=st.integers(1, 5), workers=st.integers(1, 4), chunk=st.integers(1, 5),
       run=st.integers(1, 70), seen=st.integers(0, 420), even=st.sampled_from([None, "pad", "drop"]))
def test_runs_of_a_worker_deal_every_position_once_and_keep_the_ranks(n, ranks, workers, chunk, run, seen, even):
    """Workers taking runs of ``run`` positions (a stream that does not know the DataLoader's
    batch) change neither what a rank takes nor that every position is dealt once."""
    length = remaining(n, seen, ranks, even)
    got = []
    for r in range(ranks):
        mine = []
        for w in range(workers):
            d = Deal(length, ranks, r, workers, w, chunk, run)
            offs = d.offsets(0, d.length).tolist()
            assert all(b - a == 1 for i, (a, b) in enumerate(zip(offs, offs[1:])) if (i + 1) % run and chunk == 1
                       and ranks == 1)  # a run is consecutive positions
            mine += offs
        assert sorted(mine) == sorted(Deal(length, ranks, r, 1, 0, chunk).offsets(0, length).tolist())
        got += mine
    assert sorted(got) == list(range(length))


@settings(max_examples=examples(300), deadline=None)
@given(n=st.integers(1, 400), ranks=st.integers(1, 4), workers=st.integers(2, 4), batch=st.integers(1, 9))
def test_runs_of_the_dataloaders_batch_are_consumed_as_a_prefix(n, ranks, workers, batch):
    """A stream without batch_size deals ranks one sample at a time and workers runs of
    ``run``: a DataLoader whose batch is the run consumes a prefix of the order, so an elastic
    resume from samples_seen is exact (runs of one sample, as before, never were with workers)."""
    steps = consumption(n, ranks, workers, 1, run=batch, batch=batch)
    consumed = []
    for s, batches in enumerate(steps):
        for b in batches:
            consumed += b
        if (s + 1) * ranks * batch <= n and all(len(b) == batch for b in batches) and len(batches) == ranks:
            assert sorted(consumed) == list(range((s + 1) * ranks * batch))
    assert sorted(consumed) == list(range(n))
    if batch > 1 and n >= 2 * ranks * batch:  # runs of one: the first step is not a prefix
        first = [o for b in consumption(n, ranks, workers, 1, batch=batch)[0] for o in b]
        assert sorted(first) != list(range(ranks * batch))


def test_a_deal_of_one_sample_per_chunk_is_distributed_samplers():
    """chunk 1: rank r takes every ranks-th offset from r, like torch's DistributedSampler."""
    for r in range(3):
        d = Deal(30, 3, r, 1, 0, 1)
        assert d.offsets(0, d.length).tolist() == list(range(r, 30, 3))
    # and its workers take alternate samples
    assert Deal(30, 3, 1, 2, 1, 1).offsets(0, 5).tolist() == [4, 10, 16, 22, 28]


def test_offsets_from_any_start_equal_the_tail_of_the_whole():
    d = Deal(1000, 3, 2, 4, 1, 16)
    whole = d.offsets(0, d.length)
    for start in (0, 1, 15, 16, 17, d.length - 1, d.length):
        assert d.offsets(start, d.length).tolist() == whole[start:].tolist()


@settings(max_examples=examples(100), deadline=None)
@given(sizes=st.lists(st.integers(0, 40), min_size=1, max_size=8), window=st.integers(1, 50),
       seed=st.integers(-5, 5), epoch=st.integers(0, 3), data=st.data())
def test_the_global_order_is_a_seeded_permutation_within_windows(sizes, window, seed, epoch, data):
    order = data.draw(st.permutations(list(range(len(sizes)))))
    g = GlobalOrder(sizes, order, window, seed, epoch)
    total = sum(sizes)
    assert g.total == total
    pos = np.arange(total, dtype=np.int64)
    ks, js = g.locate(pos)
    pairs = list(zip(ks.tolist(), js.tolist()))
    assert sorted(pairs) == sorted((k, j) for k in range(len(sizes)) for j in range(sizes[k]))
    phys = g.physical(pos)
    assert (phys // window == pos // window).all()  # a sample moves only within its window
    # any subset, in any order, located alone, gives the same answer (no state carried along)
    picked = np.array(data.draw(st.lists(st.integers(0, max(0, total - 1)), max_size=20)) if total else [],
                      dtype=np.int64)
    again = GlobalOrder(sizes, order, window, seed, epoch).locate(picked)
    assert [pairs[p] for p in picked.tolist()] == list(zip(*[a.tolist() for a in again]))


def test_the_order_depends_on_seed_and_epoch_only():
    a = GlobalOrder([100, 100], [1, 0], 64, 7, 2).physical(np.arange(200))
    assert (a == GlobalOrder([100, 100], [1, 0], 64, 7, 2).physical(np.arange(200))).all()
    assert not (a == GlobalOrder([100, 100], [1, 0], 64, 7, 3).physical(np.arange(200))).all()
    assert not (a == GlobalOrder([100, 100], [1, 0], 64, 8, 2).physical(np.arange(200))).all()


@pytest.mark.parametrize("bad", [dict(rank=2, ranks=2), dict(worker=-1), dict(chunk=0), dict(length=-1)])
def test_a_bad_deal_is_refused(bad):
    args = dict(length=10, ranks=2, rank=0, workers=2, worker=0, chunk=2)
    args.update(bad)
    with pytest.raises(ValueError):
        Deal(**args)
