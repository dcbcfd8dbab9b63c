"""A worker's batch pages are written again only once no process holds them
(dsconvert.readers.batch_pages): every way a user or torch can hold a batch (the tensor, a
view, a fork, another process it was sent to, a trainer that keeps every batch) keeps its
pages from being reused, and reuse does happen once they all let go."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

pytestmark = pytest.mark.usefixtures("torch")

SIZE = 3 * 64 * 64 * 5


@pytest.fixture
def pages(torch):
    from dsconvert.readers.batch_pages import BatchPages

    pages = BatchPages()
    if pages.tensor(1) is None:
        pytest.skip("no memfd, /proc or leases here: batches are allocated as torch does")
    pages._forget()
    yield pages
    pages._forget()


def inode(tensor) -> int:
    fd, _ = tensor.untyped_storage()._share_fd_cpu_()
    return os.fstat(fd).st_ino


def test_a_segment_is_reused_once_its_batch_is_dropped_and_not_before(pages):
    first = pages.tensor(SIZE)
    first.fill_(7)
    held = inode(first)
    second = pages.tensor(SIZE)
    assert inode(second) != held  # the first is still held
    view = first[10:20]
    del first
    assert inode(pages.tensor(SIZE)) != held  # a view of it holds it
    del view
    again = pages.tensor(SIZE)
    assert inode(again) == held and again.numel() == SIZE  # let go: its pages are written again
    assert inode(pages.tensor(SIZE // 2)) not in (held, inode(second))  # the free one, smaller, reused
    assert inode(pages.tensor(SIZE * 2)) not in (held, inode(second))  # larger than any: a new one


def hold_until_told(conn, batch):
    conn.send(int(batch.sum()))
    conn.recv()


def test_a_batch_sent_to_another_process_is_not_reused_while_that_process_holds_it(torch, pages):
    batch = pages.tensor(SIZE)
    batch.fill_(1)
    held = inode(batch)
    ctx = torch.multiprocessing.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=hold_until_told, args=(theirs, batch))
    child.start()
    try:
        assert ours.recv() == SIZE
        del batch
        for _ in range(3):  # our references gone; the other process's mapping still holds it
            assert inode(pages.tensor(SIZE)) != held
        ours.send("done")
        child.join(60)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    assert held in {inode(pages.tensor(SIZE)) for _ in range(pages.keep)}  # let go: reused


def test_a_fork_holding_the_batch_keeps_it(pages):
    batch = pages.tensor(SIZE)
    held = inode(batch)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child inherits the mapping, and waits to be told to go
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        del batch
        assert inode(pages.tensor(SIZE)) != held
    finally:
        os.write(write, b"x")
        os.close(write)
        os.waitpid(pid, 0)
    assert held in {inode(pages.tensor(SIZE)) for _ in range(pages.keep)}


def test_at_most_keep_segments_stay_open_however_many_batches_are_held(pages):
    def segments_open() -> int:
        return sum("dsconvert-batch" in os.readlink(f"/proc/self/fd/{fd}")
                   for fd in map(int, os.listdir("/proc/self/fd")) if _is_link(fd))

    held = [pages.tensor(SIZE) for _ in range(3 * pages.keep)]
    assert len({inode(b) for b in held}) == len(held)  # every held batch its own pages
    assert len(pages.segments) == pages.keep and segments_open() == len(held) + pages.keep
    del held
    assert segments_open() == pages.keep  # the ones let go are freed with their last holder


def _is_link(fd: int) -> bool:
    try:
        os.readlink(f"/proc/self/fd/{fd}")
        return True
    except OSError:
        return False


def test_without_leases_or_with_file_system_sharing_it_steps_aside(torch, pages, monkeypatch):
    from dsconvert.readers import batch_pages

    with monkeypatch.context() as m:
        m.setattr(torch.multiprocessing, "get_sharing_strategy", lambda: "file_system")
        assert pages.tensor(SIZE) is None
    real = fcntl.fcntl

    def refused(fd, cmd, *args):
        if cmd == batch_pages.F_SETLEASE:
            raise OSError(errno.EINVAL, "leases are off here")
        return real(fd, cmd, *args)

    monkeypatch.setattr(fcntl, "fcntl", refused)
    assert pages.tensor(SIZE) is None and not pages.usable and pages.segments == []
    assert pages.tensor(SIZE) is None  # and stays aside


class Filled:
    """Batches whose every byte says which samples they hold."""

    def __len__(self):
        return 64 * 30

    def __getitems__(self, indices):
        from dsconvert.readers.into_batch import RowsOfBatch, new_batch

        images = new_batch(len(indices), (3, 32, 32))
        for slot, i in enumerate(indices):
            images[slot].fill_(i % 251)
        return RowsOfBatch(images, indices)


@pytest.mark.parametrize("kept", ["every", "every third", "none"])
def test_a_trainer_that_keeps_batches_never_sees_them_change(torch, kept):
    """The DataLoader's own path: workers reuse pages, a trainer keeps some or all batches
    and finds every kept batch as it came."""
    from torch.utils.data import DataLoader

    keep = {"every": 1, "every third": 3, "none": 0}[kept]
    loader = DataLoader(Filled(), batch_size=64, num_workers=2, shuffle=True)
    held, seen = [], set()
    for step, (images, labels) in enumerate(loader):
        assert (images.view(len(labels), -1) == (labels % 251)[:, None].to(torch.uint8)).all()
        seen.add(inode(images))
        if keep and step % keep == 0:
            held.append((images, labels))
    for images, labels in held:
        assert (images.view(len(labels), -1) == (labels % 251)[:, None].to(torch.uint8)).all()
    assert len({inode(images) for images, _ in held}) == len(held)
    if not keep and _reuses_here():
        assert len(seen) < 30 / 2  # dropped batches' pages are used again


def _reuses_here() -> bool:
    """Whether this kernel lets a process reuse pages (memfd, /proc and leases), as workers do."""
    from dsconvert.readers.batch_pages import BatchPages

    pages = BatchPages()
    try:
        return pages.tensor(1) is not None
    finally:
        pages._forget()



def test_threads_asking_at_once_never_get_one_segment(pages):
    import threading

    held, lock, clashes = {}, threading.Lock(), []

    def ask(name):
        for _ in range(200):
            batch = pages.tensor(SIZE)
            ino = inode(batch)
            with lock:
                if ino in held.values():
                    clashes.append(ino)
                held[name] = ino
            with lock:
                del held[name]
            del batch

    threads = [threading.Thread(target=ask, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == []


def test_a_batch_torch_moved_in_the_trainer_is_not_handed_back_for_a_later_one(torch):
    """torch's receiving side caches storages by inode: a batch the trainer moved to
    file_system shared memory (share_memory_ after set_sharing_strategy("file_system")) stays
    alive under its old segment's inode; later batches written in that segment must still
    arrive as themselves (found by an attacker: 8 of 13 batches came back as batch 0's)."""
    from torch.utils.data import DataLoader

    strategy = torch.multiprocessing.get_sharing_strategy()
    loader = DataLoader(Filled(), batch_size=64, num_workers=1, prefetch_factor=1)
    batches = iter(loader)  # the worker starts under file_descriptor
    try:
        torch.multiprocessing.set_sharing_strategy("file_system")
        torch.zeros(1).share_memory_()  # torch_shm_manager started now: a later start inherits batches' fds
        kept = []
        for step, (images, labels) in enumerate(batches):
            assert (images.view(len(labels), -1) == (labels % 251)[:, None].to(torch.uint8)).all(), step
            if step == 0:
                images.share_memory_()  # its pages move to /dev/shm; the storage stays
                kept.append(images)
            if step > 12:
                break
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)
        del batches
