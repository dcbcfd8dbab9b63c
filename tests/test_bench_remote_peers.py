"""benchmarks/remote_peers.py times every reader alike: epoch 1 from before its dataset is
constructed (a reader that starts downloading at open gets no head start outside the timer) to
its last batch, the construction reported beside it. Checked by the order of events against a
counting clock, never by a time measured."""

import itertools

import pytest

from benchmarks import remote_peers


class Clock:
    """A clock that ticks one second a reading and logs each reading among the events."""

    def __init__(self, events):
        self.events = events
        self.ticks = itertools.count()

    def __call__(self):
        t = float(next(self.ticks))
        self.events.append(("clock", t))
        return t


def test_epoch_one_starts_before_the_dataset_is_built_and_ends_after_its_last_batch():
    events = []

    class Loader:
        def __iter__(self):
            for b in range(3):
                events.append(("batch", b))
                yield [b"x"] * 4, [0] * 4

    def open_loader():
        events.append(("open", None))
        return Loader()

    got = remote_peers.timed_epochs(open_loader, 12, "x", clock=Clock(events))
    kinds = [e[0] for e in events]
    assert kinds == ["clock", "open", "clock"] + ["batch"] * 3 + ["clock"] + ["batch"] * 3 + ["clock"]
    # readings 0 (before the open), 1 (after it), 2 (after epoch 1's last batch), 3 (epoch 2's)
    assert got == {"open_s": 1.0, "epoch1": 12 / 2.0, "epoch2": 12 / 1.0}


def test_a_short_epoch_is_an_error():
    with pytest.raises(SystemExit, match="11 samples"):
        remote_peers.timed_epochs(lambda: [([b"x"] * 11, [0] * 11)], 12, "x", clock=Clock([]))


@pytest.mark.parametrize("kind", ["dsconvert", "dsconvert_stream", "webdataset"])
def test_the_child_builds_each_reader_inside_the_timer(kind, monkeypatch, tmp_path, torch):
    """The dataset (our open_dataset, webdataset's WebDataset) is made by the callable the
    timer calls, never before it."""
    import dsconvert

    made, timed = [], []
    monkeypatch.setattr(dsconvert, "open_dataset", lambda *a, **kw: made.append(kw) or list(range(8)))
    if kind == "webdataset":
        webdataset = pytest.importorskip("webdataset")
        monkeypatch.setattr(webdataset, "WebDataset", lambda *a, **kw: made.append(kw) or _Chain())

    def timed_epochs(open_loader, n, name):
        timed.append(len(made))
        open_loader()
        timed.append(len(made))
        return {"open_s": 0.0, "epoch1": 1.0, "epoch2": 1.0}

    monkeypatch.setattr(remote_peers, "timed_epochs", timed_epochs)
    monkeypatch.setenv("DSCONVERT_CACHE", str(tmp_path))
    so = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:1", "region_name": "eu-west-1"}}
    config = {"storage_options": so, "cache": str(tmp_path / "c"), "n": 8, "batch": 4, "workers": 0,
              "url": "s3://b/wds", "urls": ["http://127.0.0.1:1/a.tar"]}
    remote_peers.child(kind, config)
    assert timed == [0, 1]  # nothing made before the timer's first reading; made by its callable


class _Chain(list):
    """WebDataset's fluent calls, as the child makes them, on a stand-in."""

    def to_tuple(self, *a):
        return self

    def map_tuple(self, *a):
        return self


def test_the_table_names_the_open_time_and_reads_results_without_it():
    cell = {"median": 1.0, "min": 1.0, "max": 1.0, "rounds": [1.0]}
    data = {"photos": 8, "shards": 2, "shard_bytes": 10**6, "workers": 2, "batch": 4, "rounds": 1,
            "delays_ms": ["0"], "contenders": ["dsconvert", "litdata"],
            "reading": {"dsconvert": {"0": {"epoch1": cell, "epoch2": cell, "open_s": cell}},
                        "litdata": {"0": {"epoch1": cell, "epoch2": cell}}},  # an earlier run's: no open_s
            "vs_litdata": {k: {"0": {"epoch1": cell, "epoch2": cell}} for k in ("dsconvert", "litdata")}}
    table = remote_peers.render(data)
    assert "| 0 ms, open (s) | 0 ms, epoch 1 | 0 ms, epoch 2 |" in table
    assert "| 1.00 [1.00-1.00] | 1 [1-1] | 1 [1-1] |" in table
    assert "| – | 1 [1-1] | 1 [1-1] |" in table
