"""Per-process state and file locks: what a fork, a pickle and a second taker see."""

import multiprocessing as mp
import os
import pickle

import pytest

from dsconvert.io.locks import file_lock
from dsconvert.processes import ProcessLocal, available_cpus


def test_process_local_is_empty_in_a_forked_child_and_kept_in_the_parent():
    state = ProcessLocal()
    state["handle"] = object()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what a forked DataLoader worker sees
        os.write(write, b"%d" % len(state))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"0"
    assert "handle" in state


def test_process_local_pickles_empty_and_still_resets_at_fork():
    state = ProcessLocal()
    state["k"] = 1
    copy = pickle.loads(pickle.dumps({"state": state}))["state"]
    assert isinstance(copy, ProcessLocal) and len(copy) == 0
    copy["k"] = 2
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, b"%d" % len(copy))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 16) == b"0"


def test_available_cpus_is_this_process_affinity():
    assert available_cpus() == len(os.sched_getaffinity(0))


def _try_lock(path, process, shared, queue):
    with file_lock(path, shared=shared, wait=False, process=process) as got:
        queue.put(got)


def _other_process(path, process=False, shared=False):
    queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_try_lock, args=(path, process, shared, queue))
    proc.start()
    proc.join(30)
    return queue.get(timeout=5)


@pytest.mark.parametrize("process", [False, True])
def test_an_exclusive_lock_excludes_another_process_until_released(tmp_path, process):
    path = str(tmp_path / "lock")
    with file_lock(path, process=process) as got:
        assert got
        assert _other_process(path, process) is False
    assert _other_process(path, process) is True


def test_shared_locks_share_and_exclude_an_exclusive_one(tmp_path):
    path = str(tmp_path / "lock")
    with file_lock(path, shared=True):
        assert _other_process(path, shared=True) is True
        assert _other_process(path, shared=False) is False


def test_a_refused_second_process_lock_in_one_process_keeps_the_first(tmp_path):
    """POSIX drops every record lock of a process when it closes any descriptor of the file:
    a second attempt from the same process must not open one."""
    path = str(tmp_path / "lock")
    with file_lock(path, process=True):
        with file_lock(path, wait=False, process=True) as again:
            assert again is False
        assert _other_process(path, process=True) is False  # still ours
    assert _other_process(path, process=True) is True


def test_flock_between_threads_of_one_process(tmp_path):
    """flock is held by the open file: two threads of one process exclude each other (the
    shard cache relies on it); a process lock would not."""
    import threading

    path = str(tmp_path / "lock")
    seen = []

    def probe():
        with file_lock(path, wait=False) as got:
            seen.append(got)

    with file_lock(path):
        t = threading.Thread(target=probe)
        t.start()
        t.join()
    probe()
    assert seen == [False, True]


def _frozen_in_worker(label):
    """A target transform that reports, from inside the worker, how many objects are frozen."""
    import gc

    return gc.get_freeze_count()


@pytest.mark.parametrize("fmt", ["wds", "npy", "source"])
def test_dataloader_workers_freeze_what_they_inherit_and_the_main_process_does_not(torch, image_folder, tmp_path,
                                                                                   fmt):
    """A forked worker's first full collection walks every object its parent made and copies
    the pages they lie on; the readers freeze those objects in each worker, never in the
    user's own process."""
    import gc

    from dsconvert import convert, open_dataset, open_source

    if fmt == "source":  # the source as it is, the baseline dsconvert bench and analyze measure
        ds = open_source(image_folder, decode="numpy", target_transform=_frozen_in_worker)
    else:
        out = str(tmp_path / fmt)
        convert(image_folder, out, format=fmt)
        ds = open_dataset(out, decode="numpy", target_transform=_frozen_in_worker)
    before = gc.get_freeze_count()
    in_main = [y for _, y in ds] if fmt == "wds" else [ds[i][1] for i in range(len(ds))]
    assert set(in_main) == {before} and gc.get_freeze_count() == before
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=lambda b: [y for _, y in b],
                                         multiprocessing_context="fork")
    counts = [y for batch in loader for y in batch]
    assert len(counts) == len(ds) and min(counts) > before + 1000


def test_a_forked_child_does_not_keep_a_lock_another_thread_held_at_the_fork(tmp_path):
    """A DataLoader worker forked while a background fetch holds a cached file's flock must not
    keep it: the flock belongs to the open file, which the child's copy of the descriptor
    would hold for the child's life (the child then waiting on itself)."""
    import threading

    path = str(tmp_path / "lock")
    taken, release = threading.Event(), threading.Event()

    def holder():
        with file_lock(path):
            taken.set()
            release.wait(30)

    t = threading.Thread(target=holder)
    t.start()
    taken.wait(30)
    go_read, go_write = os.pipe()
    out_read, out_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: waits until the parent's thread let go, then tries the lock
        os.read(go_read, 1)
        with file_lock(path, wait=False) as got:
            os.write(out_write, b"1" if got else b"0")
        os._exit(0)
    release.set()
    t.join()
    os.write(go_write, b"x")
    os.waitpid(pid, 0)
    assert os.read(out_read, 1) == b"1"


def test_a_fork_while_another_thread_lets_go_of_a_lock_waits_for_it(tmp_path, monkeypatch):
    """Between forgetting a flock's descriptor and closing it, a fork gave the child an
    unrecorded copy of the locked file, locked for the child's life (a DataLoader worker then
    waited on itself for ever): the fork now waits until the close is done."""
    import threading
    import time
    import types

    from dsconvert.io import locks

    path = str(tmp_path / "lock")
    closing = threading.Event()

    def slow_close(fd):  # the window, made wide: the holder is between forgetting and closing
        closing.set()
        time.sleep(0.3)
        os.close(fd)

    names = {k: getattr(os, k) for k in dir(os) if not k.startswith("__")}
    monkeypatch.setattr(locks, "os", types.SimpleNamespace(**dict(names, close=slow_close)))

    def holder():
        with file_lock(path):
            pass

    t = threading.Thread(target=holder)
    t.start()
    closing.wait(30)
    out_read, out_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child, forked while the holder closes
        with file_lock(path, wait=False) as got:
            os.write(out_write, b"1" if got else b"0")
        os._exit(0)
    t.join()
    os.waitpid(pid, 0)
    assert os.read(out_read, 1) == b"1"
