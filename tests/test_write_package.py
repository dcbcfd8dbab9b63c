"""One write package (dsconvert/write/): convert, Writer and optimize share one set of option
checks, one output life cycle and one executor loop, and that loop takes specs lazily.

Structure first (the "already holds" error is made in one place; convert and optimize both go
through ``run_shards``; each shared option is refused by all three writers in the same words),
then the loop's bound: with a generator of real specs and an executor that counts what it
holds, never more than the bound are outstanding and no spec is pulled before there is room."""

import ast
import concurrent.futures as cf
import os
import pathlib
import threading

import numpy as np
import pytest

import dsconvert
from dsconvert import OptionError, OutputExistsError, Writer, optimize
from dsconvert.formats import get
from dsconvert.manifest import Manifest
from dsconvert.plan import ShardSpec, spread_plan
from dsconvert.source import scan
from dsconvert.write import loop

PACKAGE = pathlib.Path(dsconvert.__file__).parent
convert = dsconvert.convert


def sample(i):
    """A real (image, label) sample for Writer and optimize (module level: pickled to workers)."""
    return {"__key__": f"s/{i:03d}", "jpg": np.full((8, 8, 3), (i * 37) % 256, dtype=np.uint8), "cls": i % 2}


# --- the "already holds" error: made in one place ------------------------------------------


def _raised_texts(path):
    """The string parts of every ``raise`` statement in the module at ``path``."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Raise):
            yield " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def test_already_holds_is_raised_in_one_place():
    found = [str(p.relative_to(PACKAGE)) for p in sorted(PACKAGE.rglob("*.py"))
             for text in _raised_texts(p) if "already holds a finished" in text]
    assert found == ["write/output.py"], found


def test_every_writer_refuses_a_finished_output_through_it(tmp_path, image_folder):
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    said = {}
    with pytest.raises(OutputExistsError) as exc:
        convert(image_folder, out, workers=1, samples_per_shard=3)  # other options
    said["convert"] = str(exc.value)
    with pytest.raises(OutputExistsError) as exc:
        optimize(sample, range(4), out, workers=1)
    said["optimize"] = str(exc.value)
    with pytest.raises(OutputExistsError) as exc:
        Writer(out).open()
    said["Writer"] = str(exc.value)
    url = os.path.abspath(out)
    assert said == {
        "convert": f"{url} already holds a finished conversion made with other options or another source; "
                   "pass --overwrite to replace it",
        "optimize": f"{url} already holds a finished output made with other options or inputs; "
                    "pass overwrite=True to replace it",
        "Writer": f"{url} already holds a finished output; pass overwrite=True to replace it",
    }
    assert Manifest.load(out).num_samples == 16  # refused: nothing of it touched


# --- one executor loop ----------------------------------------------------------------------


def test_convert_and_optimize_both_write_through_run_shards(tmp_path, image_folder, monkeypatch):
    calls = []
    real = loop.run_shards

    def counted(specs, total, job, **kwargs):
        calls.append(total)
        return real(specs, total, job, **kwargs)

    monkeypatch.setattr(loop, "run_shards", counted)
    convert(image_folder, str(tmp_path / "c"), samples_per_shard=4, workers=1)
    optimize(sample, range(6), str(tmp_path / "o"), samples_per_shard=2, workers=1)
    assert calls == [4, 3]


# --- one option check each, one message -----------------------------------------------------


def _said(call):
    with pytest.raises(OptionError) as exc:
        call()
    return str(exc.value)


BAD = [  # (option, bad value, the writers that take the option, the message)
    ("format", "tiff", ("convert", "Writer", "optimize"), "format must be one of wds, hdf5, npy, not 'tiff'"),
    ("prefix", "a/b", ("convert", "Writer", "optimize"), "prefix must be a plain file name stem, not 'a/b'"),
    ("prefix", ".hidden", ("convert", "Writer", "optimize"), "prefix must be a plain file name stem, not '.hidden'"),
    ("quality", 0, ("convert", "Writer", "optimize"), "quality must be an int within 1..100, not 0"),
    ("quality", 101, ("convert", "Writer", "optimize"), "quality must be an int within 1..100, not 101"),
    ("quality", 90.5, ("convert", "Writer", "optimize"), "quality must be an int within 1..100, not 90.5"),
    ("samples_per_shard", 0, ("convert", "Writer", "optimize"), "samples_per_shard must be a positive int, not 0"),
    ("samples_per_shard", "10", ("convert", "Writer", "optimize"),
     "samples_per_shard must be a positive int, not '10'"),
    ("min_shards", 0, ("convert", "optimize"), "min_shards must be a positive int, not 0"),
    ("min_shards", True, ("convert", "optimize"), "min_shards must be a positive int, not True"),
    ("shard_size", 0, ("convert", "Writer"), "shard_size must be positive, not 0"),
    ("shard_size", 1.5e9, ("convert", "Writer"),
     "shard_size must be a size (an int of bytes, or a str such as '1GB'), not 1500000000.0"),
]
FORMAT_BOUND = [  # options a format refuses: (format, option, value, the message's start)
    ("hdf5", "compress", "zstd", "compress applies to wds outputs: hdf5 holds images and labels only"),
    ("wds", "decode", True, "decode=True needs a format that stores pixels (hdf5, npy)"),
]


def _writers(tmp_path, image_folder):
    return {
        "convert": lambda **kw: convert(image_folder, str(tmp_path / "c"), workers=1, **kw),
        "Writer": lambda **kw: Writer(str(tmp_path / "w"), **kw),
        "optimize": lambda **kw: optimize(sample, range(4), str(tmp_path / "o"), workers=1, **kw),
    }


@pytest.mark.parametrize("option,value,takers,message", BAD, ids=[f"{o}={v!r}" for o, v, _, _ in BAD])
def test_a_shared_option_is_refused_by_every_writer_in_the_same_words(tmp_path, image_folder, option, value,
                                                                     takers, message):
    writers = _writers(tmp_path, image_folder)
    said = {name: _said(lambda name=name: writers[name](**{option: value})) for name in takers}
    assert said == {name: message for name in takers}
    assert not any((tmp_path / d).exists() for d in "cwo")  # refused before the output is touched


@pytest.mark.parametrize("format,option,value,start", FORMAT_BOUND, ids=[o for _, o, _, _ in FORMAT_BOUND])
def test_a_format_bound_option_is_refused_by_every_writer_in_the_same_words(tmp_path, image_folder, format, option,
                                                                           value, start):
    writers = _writers(tmp_path, image_folder)
    said = {name: _said(lambda call=call: call(format=format, **{option: value})) for name, call in writers.items()}
    assert len(set(said.values())) == 1 and said["convert"].startswith(start), said


# --- the loop takes a generator of specs, a bounded window at a time ------------------------


def _specs(image_folder, out, per_shard, pulled):
    """Real shard specs of ``image_folder``, built one at a time as the loop asks; ``pulled``
    counts them."""
    source = scan(image_folder)
    fmt = get("wds")
    ranges = spread_plan(source.samples, per_shard, 1 << 40, 1)

    def specs():
        for i, (a, b) in enumerate(ranges):
            pulled.append(i)
            yield ShardSpec("wds", i, fmt.shard_name("shard", i), source.root, out, source.sample_type,
                            tuple(source.samples[a:b]))
    return specs(), len(ranges)


class CountingExecutor(cf.Executor):
    """A real thread pool that counts the futures submitted and not yet done (by their state,
    which is set before anyone waiting on them wakes). Its tasks wait until the window first
    fills (``bound`` outstanding), so that a loop submitting past the bound is seen doing it."""

    def __init__(self, bound):
        self.pool = cf.ThreadPoolExecutor(2)
        self.bound = bound
        self.lock = threading.Lock()
        self.futures = []
        self.most = 0
        self.full = threading.Event()

    @property
    def outstanding(self):
        return sum(not f.done() for f in self.futures)

    def submit(self, fn, *args, **kwargs):
        def gated():
            self.full.wait(60)  # not a timing: a loop that never fills the window still finishes
            return fn(*args, **kwargs)

        with self.lock:
            self.futures.append(self.pool.submit(gated))
            busy = self.outstanding
            self.most = max(self.most, busy)
            if busy >= self.bound:
                self.full.set()
            return self.futures[-1]

    def shutdown(self, wait=True, **kwargs):
        self.full.set()
        self.pool.shutdown(wait=wait)


def test_the_loop_never_holds_more_than_its_bound_and_pulls_specs_only_into_room(tmp_path, image_folder):
    from dsconvert.convert import write_shard

    out = str(tmp_path / "out")
    os.makedirs(out)
    pulled, busy_when_pulled = [], []
    executor = CountingExecutor(bound=4)  # workers=2: the default bound is 2 per worker
    specs, total = _specs(image_folder, out, 1, pulled)

    def watched():
        for spec in specs:
            busy_when_pulled.append(executor.outstanding)
            yield spec

    try:
        results = loop.run_shards(watched(), total, lambda spec: (write_shard, (spec,)), workers=2,
                                  executor=executor)
    finally:
        executor.shutdown()
    assert total == 16 and pulled == list(range(16))
    assert executor.most == 4, executor.most  # the window filled, and never past it
    assert max(busy_when_pulled) < 4, busy_when_pulled  # a spec is pulled only when there is room
    assert [r.entry.name for r in results] == [f"shard-{i:06d}.tar" for i in range(16)]  # in spec order
    assert all(os.path.exists(os.path.join(out, r.entry.name)) for r in results)


def test_one_worker_pulls_the_next_spec_only_after_the_last_is_written(tmp_path, image_folder):
    from dsconvert.convert import write_shard

    out = str(tmp_path / "out")
    os.makedirs(out)
    pulled, written = [], []
    specs, total = _specs(image_folder, out, 4, pulled)

    def job(spec):
        assert pulled[-1] == spec.index  # nothing pulled ahead of the shard being written
        written.append(spec.index)
        return write_shard, (spec,)

    results = loop.run_shards(specs, total, job, workers=1)
    assert written == pulled == [0, 1, 2, 3] and [r.entry.num_samples for r in results] == [4, 4, 4, 4]
    again, rewritten = [], []
    specs, total = _specs(image_folder, out, 4, again)
    resumed = loop.run_shards(specs, total, lambda s: rewritten.append(s) or (write_shard, (s,)), workers=1)
    assert rewritten == [] and all(r.resumed for r in resumed)  # finished shards are kept, not written again


def test_a_generator_that_yields_other_than_announced_is_an_internal_error(tmp_path, image_folder):
    from dsconvert.convert import write_shard

    out = str(tmp_path / "out")
    os.makedirs(out)
    specs, total = _specs(image_folder, out, 8, [])
    with pytest.raises(RuntimeError, match="not the 3 announced"):
        loop.run_shards(specs, total + 1, lambda s: (write_shard, (s,)), workers=1)


def test_the_window_is_twice_what_the_executor_runs_at_once():
    with cf.ThreadPoolExecutor(5) as pool:
        assert loop.in_flight_bound(pool, 1) == 10  # a pool says its size
        assert loop.in_flight_bound(pool, 8) == 16  # the workers asked for, where more
    counting = CountingExecutor(4)
    assert loop.in_flight_bound(counting, 3) == 6  # an executor that does not say: the workers
    counting.shutdown()
