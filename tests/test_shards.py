import pytest
from hypothesis import given, strategies as st

from dsconvert.plan import MIN_SPREAD_SAMPLES, parse_size, plan_shards, spread_plan
from dsconvert.samples import Sample, SourceFile


def samples_of(sizes):
    return [Sample(f"k{i}", (SourceFile("jpg", f"k{i}.jpg", s, 0),)) for i, s in enumerate(sizes)]


@given(st.lists(st.integers(0, 5000), max_size=200), st.integers(1, 20), st.integers(1, 20000))
def test_every_sample_in_exactly_one_shard_within_limits(sizes, max_samples, max_bytes):
    samples = samples_of(sizes)
    ranges = plan_shards(samples, max_samples, max_bytes)
    covered = [i for a, b in ranges for i in range(a, b)]
    assert covered == list(range(len(samples)))
    for a, b in ranges:
        assert 1 <= b - a <= max_samples
        total = sum(sizes[a:b])
        assert total <= max_bytes or b - a == 1  # an oversized sample gets a shard alone


@given(st.lists(st.integers(0, 5000), max_size=3000), st.integers(1, 20000), st.integers(1, 10**7),
       st.integers(1, 40))
def test_a_spread_plan_keeps_the_limits_and_gives_workers_shards(sizes, max_samples, max_bytes, min_shards):
    samples = samples_of(sizes)
    ranges = spread_plan(samples, max_samples, max_bytes, min_shards)
    assert [i for a, b in ranges for i in range(a, b)] == list(range(len(samples)))
    for a, b in ranges:
        assert 1 <= b - a <= max_samples and (sum(sizes[a:b]) <= max_bytes or b - a == 1)
    limits = plan_shards(samples, max_samples, max_bytes)
    if len(limits) >= min_shards or len(samples) < MIN_SPREAD_SAMPLES * 2:
        assert ranges == limits  # nothing to spread, or too small to be worth it
    else:  # up to min_shards runs of near-equal length, >= 64 samples, cut further only by the byte limit
        want = min(min_shards, len(samples) // MIN_SPREAD_SAMPLES)
        assert len(ranges) >= want
        if len(ranges) == want:
            lengths = [b - a for a, b in ranges]
            assert min(lengths) >= MIN_SPREAD_SAMPLES and max(lengths) - min(lengths) <= 1


def test_four_thousand_photos_make_sixteen_shards_not_one():
    samples = samples_of([45_000] * 4000)
    assert len(plan_shards(samples, 10000, 10**9)) == 1
    assert spread_plan(samples, 10000, 10**9, 16) == [(i * 250, (i + 1) * 250) for i in range(16)]
    assert spread_plan(samples, 10000, 10**9, 1) == [(0, 4000)]
    assert spread_plan(samples_of([1] * 100), 10000, 10**9, 16) == [(0, 100)]  # 64 samples a shard at least
    lengths = [b - a for a, b in spread_plan(samples_of([1] * 1025), 10000, 10**9, 16)]
    assert len(lengths) == 16 and set(lengths) == {64, 65}  # near-equal, not 15 x 65 + 50


def test_limits_whichever_first():
    assert plan_shards(samples_of([10] * 10), 4, 10**6) == [(0, 4), (4, 8), (8, 10)]
    assert plan_shards(samples_of([10] * 10), 100, 25) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]


@pytest.mark.parametrize("text, value", [
    ("1GB", 10**9), ("512MiB", 512 * 2**20), ("4096", 4096), ("1.5kb", 1500), ("2 gib", 2 * 2**30),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


def test_parse_size_rejects_nonsense():
    with pytest.raises(ValueError, match="not a size"):
        parse_size("lots")
