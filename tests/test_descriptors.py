"""Every close is idempotent and owned once (issue 33, class 7): a reader's byte source closed
twice, under threads, never closes a descriptor that another file has since been given."""

import os
import threading

import pytest

from dsconvert import convert
from dsconvert.formats import get
from dsconvert.io.ranges import PreadBytes, PrefetchedBytes, local_fill
from dsconvert.io.shard_cache import ShardAccess
from dsconvert.manifest import Manifest

from conftest import make_image_folder


@pytest.fixture(scope="module")
def out(tmp_path_factory, photos):
    root = tmp_path_factory.mktemp("fds")
    src = str(root / "src")
    make_image_folder(src, photos, {"a": 6, "b": 6}, size=(32, 24))
    out = str(root / "out")
    convert(src, out, samples_per_shard=4, workers=1)
    return out


def _sources(out):
    """Every kind of byte source a shard reader closes, each opened anew."""
    manifest = Manifest.load(out)
    entry = manifest.shards[0]
    shard = get("wds").open_shard(ShardAccess(out), entry, manifest)
    path = os.path.join(out, entry.name)
    yield "pread", PreadBytes(path, entry.bytes)
    yield "prefetched", PrefetchedBytes.local(path, entry.bytes)
    yield "scattered", shard.scattered([0, 1], True)
    fill, close = local_fill(path)
    yield "fill", type("Fill", (), {"close": staticmethod(close)})()


def test_a_second_close_leaves_a_reused_descriptor_alone(out, tmp_path):
    bystander = tmp_path / "bystander"
    bystander.write_bytes(b"x" * 100)
    for name, source in _sources(out):
        source.close()
        fd = os.open(bystander, os.O_RDONLY)  # most likely the number the source just gave back
        try:
            source.close()
            assert os.pread(fd, 10, 0) == b"x" * 10, name
        finally:
            os.close(fd)


def test_double_closes_under_threads_never_close_another_thread_s_file(out, tmp_path):
    bystander = tmp_path / "bystander"
    bystander.write_bytes(b"y" * 4096)
    errors = []
    stop = threading.Event()

    def closer():
        while not stop.is_set():
            for name, source in _sources(out):
                source.close()
                try:
                    source.close()
                except OSError as exc:  # a second close that is not a no-op
                    errors.append(f"{name}: {exc!r}")

    def reader():
        for _ in range(400):
            try:
                with open(bystander, "rb", buffering=0) as f:
                    for _ in range(5):
                        if os.pread(f.fileno(), 16, 0) != b"y" * 16:
                            errors.append("wrong bytes")
            except OSError as exc:  # EBADF: another thread's second close took our descriptor
                errors.append(repr(exc))

    closers = [threading.Thread(target=closer) for _ in range(3)]
    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in closers + readers:
        t.start()
    for t in readers:
        t.join()
    stop.set()
    for t in closers:
        t.join()
    assert errors == []


def _open_under(root):
    """The descriptors of this process open on files under root: counting every descriptor would
    also count what other tests' objects close when the collector runs."""
    root = os.path.realpath(root)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root + os.sep):
            held.append(target)
    return held


def test_a_map_style_dataset_closes_its_shards_when_dropped(out):
    import gc

    from dsconvert import open_dataset

    assert _open_under(out) == []
    ds = open_dataset(out, decode="raw")
    [ds[i] for i in range(len(ds))]
    assert _open_under(out) != []
    del ds
    gc.collect()
    assert _open_under(out) == []
