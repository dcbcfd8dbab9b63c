"""Mid-epoch resumption: a real StatefulDataLoader (torchdata) with worker processes, stopped
after k steps, its state saved, and a new process resuming it must read exactly the steps an
uninterrupted run reads after k, for every format; on real gloo ranks too, and on another
number of ranks and workers from ``{"epoch", "samples_seen"}`` alone."""

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

from dsconvert import convert

from conftest import make_image_folder

pytest.importorskip("torchdata.stateful_dataloader")

JOB = os.path.join(os.path.dirname(__file__), "support", "resume_job.py")
N, B = 50, 4  # 13 steps, the last one short; shards of 8 samples
STOPS = [1, 2, 6, 12, 13]  # first batch, a shard's end, inside a shuffle window, before and after the last


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("resume")
    src = str(root / "src")
    make_image_folder(src, photos, {"a": 27, "b": 23}, size=(24, 16))
    outs = {}
    for fmt in ("wds", "hdf5", "npy"):
        outs[fmt] = str(root / fmt)
        convert(src, outs[fmt], format=fmt, samples_per_shard=8, workers=1)
    return outs


def launch(tmp_path, name, cases, world=1):
    """Run the job in ``world`` new processes (gloo ranks when > 1); their results by rank."""
    config = tmp_path / f"{name}.json"
    config.write_text(json.dumps(cases))
    result = str(tmp_path / f"{name}-result")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if world > 1:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = str(s.getsockname()[1])
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(world))
    procs = [subprocess.Popen([sys.executable, JOB, str(config), result], env=dict(env, RANK=str(r)))
             for r in range(world)]
    for p in procs:
        assert p.wait(timeout=300) == 0
    return [json.loads(open(f"{result}.{r}.json").read()) for r in range(world)]


CASES = [
    dict(name="wds-0", kind="stream", out="wds", workers=0),
    dict(name="wds-2", kind="stream", out="wds", workers=2),
    dict(name="wds-1-batched", kind="stream", out="wds", workers=1, in_dataset=True),
    dict(name="wds-2-batched", kind="stream", out="wds", workers=2, in_dataset=True, window=1000),
    dict(name="hdf5-2", kind="map", out="hdf5", workers=2),
    dict(name="npy-0", kind="map", out="npy", workers=0, decode="numpy"),
    dict(name="npy-2-sampler", kind="sampler", out="npy", workers=2, decode="numpy"),
]


@pytest.mark.slow
def test_a_stopped_epoch_resumes_exactly_in_a_new_process(tmp_path, outputs):
    cases = []
    for case in CASES:
        case = dict(case, out=outputs[case["out"]], batch=B, stops=STOPS, states=str(tmp_path))
        cases += [dict(case, phase="full"), dict(case, phase="stop")]
    first = launch(tmp_path, "first", cases)[0]
    second = launch(tmp_path, "second", [dict(c, phase="resume") for c in cases if c["phase"] == "stop"])[0]
    for case in CASES:
        full = first[f"{case['name']}/full"]["steps"]
        assert sorted(d for step in full for d in step) == sorted(set(d for step in full for d in step))
        assert sum(map(len, full)) == N, case["name"]
        for k in STOPS:
            before, after = first[f"{case['name']}/stop"][str(k)], second[f"{case['name']}/resume"][str(k)]
            assert before == full[:k], (case["name"], k)
            assert after == full[k:], (case["name"], k)


@pytest.mark.slow
@pytest.mark.system
def test_gloo_ranks_resume_on_the_same_and_on_another_topology(tmp_path, outputs):
    """2 gloo ranks x 2 workers stop after 3 steps; 2 new ranks resume from the loader states;
    3 new ranks x 1 worker continue from samples_seen = 3 steps x 4 x 2 ranks: together with
    what the first job consumed, every sample exactly once."""
    k = 3
    cases = [dict(name="wds", kind="stream", out=outputs["wds"], workers=2, in_dataset=True, even=None),
             dict(name="npy", kind="sampler", out=outputs["npy"], workers=2, decode="numpy", even=None)]
    cases = [dict(c, batch=B, stops=[k], states=str(tmp_path)) for c in cases]
    first = launch(tmp_path, "first", [dict(c, phase=p) for c in cases for p in ("full", "stop")], world=2)
    second = launch(tmp_path, "second", [dict(c, phase="resume") for c in cases], world=2)
    seen = k * B * 2
    elastic = launch(tmp_path, "elastic", [dict(c, phase="elastic", workers=1, seen=[seen]) for c in cases], world=3)
    for case in cases:
        name = case["name"]
        every = Counter(d for r in first for step in r[f"{name}/full"]["steps"] for d in step)
        assert len(every) == N and set(every.values()) == {1}, name
        consumed = []
        for r in range(2):
            full, before = first[r][f"{name}/full"]["steps"], first[r][f"{name}/stop"][str(k)]
            assert before == full[:k] and second[r][f"{name}/resume"][str(k)] == full[k:], (name, r)
            consumed += [d for step in before for d in step]
        rest = [d for r in elastic for step in r[f"{name}/elastic"][str(seen)] for d in step]
        assert Counter(consumed + rest) == every, name
        # the new ranks take as many steps (to one), and the iteration after it is a whole epoch
        lengths = [len(r[f"{name}/elastic"][str(seen)]) for r in elastic]
        assert max(lengths) - min(lengths) <= 1
        assert sum(r[f"{name}/elastic"][f"next-{seen}"] for r in elastic) >= N // B


def _keys(loader):
    import hashlib

    out = []
    for batch in loader:
        pair = isinstance(batch, (tuple, list)) and len(batch) == 2 and not isinstance(batch[0], bytes)
        images = batch[0] if pair else [batch[0]]
        out += [hashlib.sha1(bytes(x)).hexdigest()[:12] for x in images]
    return out


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_set_epoch_reaches_persistent_workers(outputs, context):
    """Workers kept alive across epochs read the epoch the trainer set, not the first one."""
    from torch.utils.data import DataLoader

    from dsconvert import open_dataset

    def fresh(epoch):
        ds = open_dataset(outputs["wds"], decode="raw", shuffle=True, seed=9, batch_size=B)
        ds.set_epoch(epoch)
        return _keys(DataLoader(ds, batch_size=None, num_workers=2))

    ds = open_dataset(outputs["wds"], decode="raw", shuffle=True, seed=9, batch_size=B)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, multiprocessing_context=context)
    epochs = []
    for epoch in (0, 1, 2):
        ds.set_epoch(epoch)
        epochs.append(_keys(loader))
    assert epochs[0] != epochs[1] != epochs[2]
    assert epochs == [fresh(e) for e in (0, 1, 2)]


@pytest.mark.parametrize("even", [None, "pad", "drop"])
def test_an_elastic_resume_in_the_trainer_process(outputs, even):
    """Ranks 2 -> 3 (num_workers=0): the consumed prefix plus what the new ranks read is every
    sample once (pad/drop: their repeats and drops are of what was left); the iteration after it
    starts the epoch again, and set_epoch to another epoch drops a pending resume."""
    from torch.utils.data import DataLoader

    from dsconvert import open_dataset

    def job(world, seen=None, steps=None):
        got = []
        for r in range(world):
            ds = open_dataset(outputs["wds"], decode="raw", shuffle=True, seed=4, rank=r, world_size=world, even=even)
            ds.set_epoch(2)
            if seen is not None:
                ds.load_state_dict({"epoch": 2, "samples_seen": seen})
                assert ds.state_dict() == {"epoch": 2, "samples_seen": seen, "dataset": ds.manifest.identity(),
                                           "seed": 4, "shuffle": 1000}
            keys = _keys(DataLoader(ds, batch_size=B))
            got.append(keys if steps is None else keys[: steps * B])
            if seen is not None:
                assert len(_keys(DataLoader(ds, batch_size=B))) == len(ds)  # the next one is whole
                ds.load_state_dict({"epoch": 2, "samples_seen": seen})
                ds.set_epoch(3)
                assert len(_keys(DataLoader(ds, batch_size=B))) == len(ds)
        return got

    everything = Counter(k for keys in job(1) for k in keys)
    first = job(2, steps=3)
    rest = job(3, seen=3 * B * 2)
    got = Counter(k for keys in first + rest for k in keys)
    if even is None:
        assert got == everything
    else:
        assert set(got) <= set(everything) and len({len(keys) for keys in rest}) == 1
        left = N - 3 * B * 2
        assert sum(map(len, rest)) == (left - left % 3 if even == "drop" else -(-left // 3) * 3)
        if even == "pad":
            assert set(got) == set(everything)


def test_a_resume_late_in_the_epoch_reads_only_what_is_left(outputs, monkeypatch):
    """The position is found by arithmetic: nothing before it is read again."""
    import os

    from dsconvert import open_dataset

    reads = []
    original = os.pread  # raw reads pread each sample (PreadBytes.get, inlined in the reader's loop)
    monkeypatch.setattr(os, "pread", lambda fd, size, offset: reads.append(offset) or original(fd, size, offset))
    ds = open_dataset(outputs["wds"], decode="raw", shuffle=True, seed=1)
    whole = list(ds)
    state = ds.state_dict()
    assert state["yielded"] == N and state["worker"] == [0, 1, 0, 1, 1]
    reads.clear()
    ds.load_state_dict(dict(state, yielded=N - 3))
    assert list(ds) == whole[-3:] and len(reads) == 3


@pytest.mark.parametrize("state", [
    None, [], {"samples_seen": 3}, {"epoch": -1}, {"epoch": 1, "samples_seen": "9"}, {"epoch": 1.5},
    {"epoch": 1, "samples_seen": 2, "yielded": 1}, {"epoch": 1, "worker": [0, 1, 0, 1], "yielded": 1},
    {"epoch": 1, "worker": [0, 1, 0, 1, 1], "yielded": -2}, {"epoch": True}, {"epoch": 10 ** 30},
    {"epoch": 1, "samples_seen": 1 << 63}, {"epoch": 1, "worker": [0, 1, 0, 1, 1], "yielded": 10 ** 20},
    {"epoch": [0] * 100_000}, {"epoch": 0, "worker": "x" * 100_000, "yielded": 0},
])
def test_a_malformed_state_is_refused_in_one_line(outputs, state):
    from dsconvert import open_dataset
    from dsconvert.data import ResumableSampler

    ds = open_dataset(outputs["wds"], decode="raw", stream=True)
    with pytest.raises(ValueError) as err:
        ds.load_state_dict(state)
    assert len(str(err.value)) < 300 and "\n" not in str(err.value)
    if state is None or "worker" not in state and "yielded" not in state:
        with pytest.raises(ValueError):
            ResumableSampler(10, rank=0, world_size=1).load_state_dict(state)


def test_the_end_of_the_epoch_is_an_empty_rest_and_past_it_is_refused(outputs):
    from dsconvert import open_dataset
    from dsconvert.data import ResumableSampler

    ds = open_dataset(outputs["wds"], decode="raw", even="pad", world_size=3, rank=2)
    ds.load_state_dict({"epoch": 0, "samples_seen": N + 1})  # 50 samples padded to 51 over 3 ranks
    assert len(ds) == 0 and list(ds) == [] and len(list(ds)) == len(ds) > 0
    ds.load_state_dict({"epoch": 0, "samples_seen": 0, "worker": [2, 3, 0, 1, 1], "yielded": N})
    assert list(ds) == []
    sampler = ResumableSampler(N, rank=1, world_size=2, even="pad")
    sampler.load_state_dict({"epoch": 0, "samples_seen": N})
    assert len(sampler) == 0 and list(sampler) == [] and len(list(sampler)) == 25
    # padded, a job on more ranks deals more than N (up to 2N is taken); past that, refused
    ds.load_state_dict({"epoch": 0, "samples_seen": N + 2})
    for state in ({"epoch": 0, "samples_seen": 10 ** 12}, {"epoch": 0, "samples_seen": 2 * N + 1},
                  {"epoch": 0, "samples_seen": 0, "worker": [2, 3, 0, 1, 1], "yielded": 10 ** 12}):
        with pytest.raises(ValueError, match="beyond the epoch") as err:
            ds.load_state_dict(state)
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="beyond the epoch"):
        sampler.load_state_dict({"epoch": 0, "samples_seen": 2 * N + 1})
    with pytest.raises(ValueError, match="beyond the epoch"):
        ResumableSampler(N, rank=1, world_size=2, even=None).load_state_dict({"epoch": 0, "samples_seen": N + 1})


@pytest.mark.parametrize("even", ["pad", "drop", None])
@pytest.mark.parametrize("world", [1, 3])
def test_a_state_of_another_dataset_or_past_the_epoch_is_refused(outputs, tmp_path, photos, even, world):
    """States carry their dataset's identity: one saved from another output (another format,
    or the same source converted with other shards) is refused in one line, by the stream and
    by the sampler; one without it (older versions) is taken; none passes the epoch's end."""
    from dsconvert import open_dataset
    from dsconvert.data import ResumableSampler

    other_src = str(tmp_path / "src")
    make_image_folder(other_src, photos, {"a": 27, "b": 23}, size=(24, 16))
    other = str(tmp_path / "other")
    convert(other_src, other, samples_per_shard=10, workers=1)  # the same samples, other shards
    paths = [outputs["wds"], outputs["hdf5"], outputs["npy"], other]

    def readers(path):  # wds outputs stream; every local output is map-style, read through the sampler
        mapped = open_dataset(path, decode="numpy", stream=False)
        got = [ResumableSampler(mapped, rank=0, world_size=world, even=even)]
        if path in (outputs["wds"], other):
            got.append(open_dataset(path, decode="raw", stream=True, even=even, world_size=world, rank=0))
        return got

    states = {}
    for path in paths:
        for r in readers(path):
            r.load_state_dict({"epoch": 1, "samples_seen": 7})  # no identity: taken
            states.setdefault(path, []).append(r.state_dict())
            assert r.state_dict()["samples_seen"] == 7 and isinstance(r.state_dict()["dataset"], str)
    stream = open_dataset(outputs["wds"], decode="raw", stream=True, shuffle=True, seed=4)
    for _ in stream:
        break
    states[outputs["wds"]].append(stream.state_dict())  # a worker's place, mid-epoch
    for path in paths:
        for r in readers(path):
            for source, saved in states.items():
                for state in saved:
                    if source == path:
                        if "worker" not in state and state["shuffle"] == r.state_dict()["shuffle"]:
                            r.load_state_dict(state)  # (another order is refused: the next test)
                        continue
                    with pytest.raises(ValueError, match="another dataset") as err:
                        r.load_state_dict(state)
                    assert "\n" not in str(err.value) and len(str(err.value)) < 300
            for seen in ((2 * N + world if even == "pad" else N + world), 2 * N + 100, 10 ** 15):
                with pytest.raises(ValueError, match="beyond the epoch"):
                    r.load_state_dict({"epoch": 0, "samples_seen": seen})
            r.load_state_dict({"epoch": 0, "samples_seen": N})  # the end: an empty rest


def test_a_state_of_another_order_is_refused(outputs):
    """Issue 40, item 7, the whole class: a stream state (the trainer's, and a worker's place
    mid-epoch) and a sampler state, saved under each of several seeds and shuffles, loaded into
    a reader of each: taken exactly when the two read the same order (the oracle: the epoch's
    samples as each reads them), and then it resumes exactly; else refused in one line, naming
    the seed. A state that names no order (an older version's) is taken."""
    from dsconvert import open_dataset
    from dsconvert.data import ResumableSampler

    stream_orders = [dict(shuffle=True, seed=0), dict(shuffle=True, seed=1), dict(shuffle=True, seed="x"),
                     dict(shuffle=True, seed=0, buffer_size=7), dict(shuffle=False, seed=0),
                     dict(shuffle=False, seed=1)]
    mapped = open_dataset(outputs["wds"], decode="raw", stream=False)
    readers = {f"stream {o}": (lambda o=o: open_dataset(outputs["wds"], decode="raw", **o)) for o in stream_orders}
    readers.update({f"sampler {o}": (lambda o=o: ResumableSampler(mapped, rank=0, world_size=1, **o))
                    for o in (dict(shuffle=True, seed=0), dict(shuffle=True, seed=5), dict(shuffle=False, seed=0),
                              dict(shuffle=False, seed=5))})

    def epoch(reader):
        reader.set_epoch(1)
        return [x if isinstance(x, int) else hashlib.sha1(bytes(x[0])).hexdigest() for x in reader]

    whole = {name: epoch(make()) for name, make in readers.items()}
    states = {}
    for name, make in readers.items():
        r = make()
        r.set_epoch(1)
        r.load_state_dict({"epoch": 1, "samples_seen": 9})
        states[name] = [r.state_dict()]
        if name.startswith("stream"):
            r = make()
            r.set_epoch(1)
            it = iter(r)
            for _ in range(9):
                next(it)
            states[name].append(r.state_dict())  # a worker's place (num_workers=0)
    for saved_by, saved in states.items():
        for name, make in readers.items():
            if saved_by.split()[0] != name.split()[0]:
                continue
            same = whole[saved_by] == whole[name]
            for state in saved:
                r = make()
                if same:
                    r.load_state_dict(state)
                    assert epoch(r) == whole[name][9:]  # the rest of the epoch, exactly
                    continue
                with pytest.raises(ValueError, match="another order") as err:
                    r.load_state_dict(state)
                assert "\n" not in str(err.value) and "seed=" in str(err.value), (saved_by, name)
                older = {k: v for k, v in state.items() if k not in ("seed", "shuffle")}
                make().load_state_dict(older)  # names no order: taken
    for bad in ({"seed": 1.5}, {"seed": None}, {"shuffle": -1}, {"shuffle": "all"}, {"seed": "x" * 1000}):
        with pytest.raises(ValueError) as err:
            open_dataset(outputs["wds"], decode="raw", stream=True).load_state_dict(dict(epoch=0, **bad))
        assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_worker_state_from_another_topology_says_how_to_resume(outputs):
    from dsconvert import open_dataset

    ds = open_dataset(outputs["wds"], decode="raw", batch_size=4)
    ds.load_state_dict({"epoch": 0, "samples_seen": 0, "worker": [0, 1, 1, 2, 4], "yielded": 1})
    with pytest.raises(ValueError, match="samples_seen"):
        iter(ds)


def test_the_shared_epoch_pickles_as_a_private_copy():
    import copy
    import pickle

    from dsconvert.readers.epoch import SharedEpoch

    a = SharedEpoch(3)
    a.resume(3, 10)
    for b in (copy.deepcopy(a), pickle.loads(pickle.dumps(a))):
        assert b.epoch == 3 and b.pending() == 10
        b.set_epoch(5)
        assert a.epoch == 3 and a.pending() == 10 and b.pending() is None
    # each (rank, worker) takes the resume once; once a rank's round (its 2 workers) has begun,
    # the next round reads the next epoch from its start
    assert a.begin(0, 0, 2) == (3, 10) and a.begin(0, 1, 2) == (3, 10)
    assert a.begin(0, 0, 2) == (4, 0) and a.begin(1, 0, 2) == (3, 10)
    a.resume(3, 10)  # every rank loads the same resume: nothing changes
    assert a.begin(1, 1, 2) == (3, 10) and a.begin(1, 0, 2) == (4, 0)


def _rank_reads(ds, rank, barrier, queue, load_in_rank):
    import hashlib

    os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), "2"
    if load_in_rank:
        ds.set_epoch(1)
        ds.load_state_dict({"epoch": 1, "samples_seen": 9})
    barrier.wait()
    queue.put((rank, [hashlib.sha1(raw).hexdigest() for raw, _ in ds]))


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
@pytest.mark.parametrize("load_in_rank", [True, False])
def test_ranks_started_from_the_trainer_each_take_the_resume(outputs, context, load_in_rank):
    """DDP ranks started by fork or spawn with the dataset made in their parent share its
    memory: the resume is taken once per rank and worker, not once per worker id."""
    import hashlib
    import multiprocessing as mp

    from dsconvert import open_dataset

    ds = open_dataset(outputs["wds"], decode="raw", shuffle=True, seed=3, even=None)
    ds.set_epoch(1)
    everything = [hashlib.sha1(raw).hexdigest() for raw, _ in ds]
    if not load_in_rank:
        ds.load_state_dict({"epoch": 1, "samples_seen": 9})
    ctx = mp.get_context(context)
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_rank_reads, args=(ds, r, barrier, queue, load_in_rank)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert sorted(got[0] + got[1]) == sorted(everything[9:])
    assert abs(len(got[0]) - len(got[1])) <= 1
