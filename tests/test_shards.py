import pytest
from hypothesis import given, strategies as st

from dsconvert.plan import parse_size, plan_shards
from dsconvert.source import Sample, SourceFile


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
