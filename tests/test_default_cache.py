"""A remote output is cached on local disk by default (dsconvert/io/default_cache.py), for real:
moto's S3 server on 127.0.0.1, DataLoader workers, the server's own request log counting what
each epoch asks of it. The default cache of every test is a folder of its own (conftest's
autouse fixture points DSCONVERT_CACHE there): never ~/.cache.
"""

import hashlib
import os
import subprocess
import sys
import time

import pytest

from dsconvert import convert, open_dataset
from dsconvert.io.default_cache import MIN_CAP, cache_home, default_shard_cache
from dsconvert.io.shard_cache import MARKER, ShardCache

from conftest import ROOT, make_image_folder

pytestmark = pytest.mark.system  # moto's S3 server, DataLoader workers


@pytest.fixture
def remote(s3, tmp_path, photos):
    """(url, local copy) of a wds output of 24 photos in 4 shards on S3."""
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 9, "b": 8, "c": 7}, size=(48, 36))
    local = str(tmp_path / "wds")
    convert(src, local, samples_per_shard=6, workers=1)
    url = s3.put_tree(local, "wds")
    s3.fs.rm_file(f"{s3.bucket}/wds/.dsconvert.lock")
    return url, local


def output_files(local):
    """The files a reader fetches: shards, their records, the order file (not the manifest)."""
    return [n for n in os.listdir(local) if not n.startswith(".") and n != "dsconvert.json"]


def digests(batches):
    return sorted(hashlib.sha1(bytes(x)).hexdigest() for images, _ in batches for x in images)


def shard_reads(s3):
    """Reads (GETs) of the output's files other than its manifest (shards, records, order)."""
    return [r for r in s3.requests("wds/") if r.startswith("GET ") and "dsconvert.json" not in r]


def raw_collate(samples):
    return [bytes(x) for x, _ in samples], [y for _, y in samples]


def epoch(torch, ds, **kw):
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, collate_fn=raw_collate, **kw)
    return digests(loader)


def test_a_remote_output_is_cached_by_default_and_epoch_two_asks_the_server_nothing(s3, remote, torch):
    url, local = remote
    want = digests([([x], [y]) for x, y in open_dataset(local, decode="raw")])
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    assert ds.access.cache is not None and ds.access.cache.dir == os.path.join(cache_home(), "shards")
    assert cache_home() == os.environ["DSCONVERT_CACHE"]  # the test's own folder, not ~/.cache
    assert type(ds).__name__ == "MapDataset"  # read by index from the copies, shuffled as a local output
    assert epoch(torch, ds, shuffle=True) == want
    first = len(shard_reads(s3))
    assert first >= 4  # every shard fetched once (and its record)
    assert epoch(torch, ds, shuffle=True) == want
    again = open_dataset(url, decode="raw", storage_options=s3.options)  # a new job: only the manifest is read
    assert epoch(torch, again, shuffle=True) == want
    assert len(shard_reads(s3)) == first
    files, _ = ShardCache(ds.access.cache.dir).usage()
    assert files == len(output_files(local)) == 9  # 4 shards, their 4 records and the order file, each once


def test_opening_fetches_every_shard_ahead_in_the_background(s3, remote, torch):
    """From open_dataset on, before any read: the workers, forked later, find every file in
    the cache and ask the server nothing; the batches are a local read's, in its order."""
    url, local = remote
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    cache = ShardCache(ds.access.cache.dir)
    deadline = time.monotonic() + 60
    while cache.usage()[0] < len(output_files(local)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert cache.usage()[0] == len(output_files(local))  # every shard came without being read
    fetched = sorted(r.split()[1] for r in shard_reads(s3))
    assert fetched == sorted(f"/{s3.bucket}/wds/{n}" for n in output_files(local))  # each once

    def ordered(dataset):
        loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=raw_collate,
                                             shuffle=True, generator=torch.Generator().manual_seed(7))
        return [batch for batch in loader]

    assert ordered(ds) == ordered(open_dataset(local, decode="raw"))  # the same samples in the same batches
    assert sorted(r.split()[1] for r in shard_reads(s3)) == fetched  # the workers asked for nothing


@pytest.mark.parametrize("cache", ["default", "off"])
def test_opening_reads_the_manifest_in_one_request_and_asks_nothing_twice(s3, remote, cache):
    """Each request open_dataset makes before it returns is a round trip the user waits for: the
    manifest is read by one GET, with no HEAD before it (an existence check, then s3fs's
    cat_file asking the size first, made it three requests where one does), and reading the
    output after asks the server no HEAD either: every file one GET, once."""
    url, local = remote
    seen = len(s3.requests())
    kw = {} if cache == "default" else {"cache_dir": False}
    ds = open_dataset(url, decode="raw", storage_options=s3.options, **kw)
    if cache == "default":
        files = ShardCache(ds.access.cache.dir)
        deadline = time.monotonic() + 60
        while files.usage()[0] < len(output_files(local)) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert sorted(bytes(x) for x, _ in ds) == sorted(bytes(x) for x, _ in open_dataset(local, decode="raw"))
    asked = s3.requests()[seen:]
    assert [r for r in asked if not r.startswith("GET ")] == []  # no HEAD, no listing
    assert [r.split()[1] for r in asked].count(f"/{s3.bucket}/wds/dsconvert.json") == 1
    if cache == "default":  # every file fetched whole, once
        assert sorted(r.split()[1] for r in asked) == sorted(f"/{s3.bucket}/wds/{n}"
                                                             for n in output_files(local) + ["dsconvert.json"])


def test_a_fetch_ahead_skips_a_file_being_fetched_and_evicts_only_over_the_cap(tmp_path, monkeypatch):
    """fetch_unless_busy never waits behind another's download of the same file; evict (whose
    exclusive lock waits until no download anywhere is running) is taken only past the cap."""
    from dsconvert.io.locks import file_lock

    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        (src / name).write_bytes(name.encode() * 1000)
    cache = ShardCache(str(tmp_path / "cache"), max_bytes=1500)
    evicted = []
    real_evict = cache.evict
    monkeypatch.setattr(cache, "evict", lambda keep=None: evicted.append(keep) or real_evict(keep))
    a = str(src / "a")
    with file_lock(cache._lock_path(a)):  # another process is fetching it
        assert cache.fetch_unless_busy(a, hashlib.sha256(b"a" * 1000).hexdigest(), 1000) is False
    assert cache.usage() == (0, 0)
    assert cache.fetch_unless_busy(a, hashlib.sha256(b"a" * 1000).hexdigest(), 1000) is True
    assert cache.usage() == (1, 1000) and evicted == []  # under the cap: no eviction lock taken
    cache.get(str(src / "b"), hashlib.sha256(b"b" * 1000).hexdigest(), 1000)
    assert len(evicted) == 1 and cache.usage() == (1, 1000)  # past it: the older copy went


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_the_default_cache_turned_off_downloads_every_epoch(s3, remote, torch, monkeypatch, how):
    url, local = remote
    want = digests([([x], [y]) for x, y in open_dataset(local, decode="raw")])
    if how == "environment":
        monkeypatch.setenv("DSCONVERT_CACHE", "off")
        ds = open_dataset(url, decode="raw", storage_options=s3.options)
    else:
        ds = open_dataset(url, decode="raw", storage_options=s3.options, cache_dir=False)
    assert ds.access.cache is None and type(ds).__name__ == "StreamDataset"
    assert epoch(torch, ds) == want
    first = len(shard_reads(s3))
    assert epoch(torch, ds) == want
    assert len(shard_reads(s3)) >= 2 * first > 0  # the second epoch downloads again
    assert default_shard_cache(url, False, None) == (None, None)
    assert default_shard_cache(local, None, None) == (None, None)  # a local output is read in place
    if how == "argument":  # ... unless asked: cache_dir=True, the default folder (a network file system)
        assert default_shard_cache(local, True, "1GB") == (os.path.join(cache_home(), "shards"), 10**9)


def test_the_default_bound_evicts_and_a_larger_output_streams(s3, remote, torch, monkeypatch):
    url, local = remote
    other = s3.put_tree(local, "other")  # a second output of the same size
    total = sum(os.path.getsize(os.path.join(local, n)) for n in output_files(local))
    monkeypatch.setenv("DSCONVERT_CACHE_SIZE", str(total + total // 2))  # one output, not two
    want = digests([([x], [y]) for x, y in open_dataset(local, decode="raw")])
    for u in (url, other):
        ds = open_dataset(u, decode="raw", storage_options=s3.options)
        assert ds.access.cache.max_bytes == total + total // 2 and type(ds).__name__ == "MapDataset"
        assert epoch(torch, ds, shuffle=True) == want
    files, nbytes = ShardCache(ds.access.cache.dir).usage()
    assert nbytes <= total + total // 2 and files < 2 * len(output_files(local))  # the least recently used went
    # an output larger than the bound is streamed: a shuffled read through the cache would fetch shards again and
    # again (an explicit cache_dir is the caller's choice, and kept)
    monkeypatch.setenv("DSCONVERT_CACHE_SIZE", str(total - 1))
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    assert ds.access.cache is None and type(ds).__name__ == "StreamDataset"
    assert epoch(torch, ds) == want
    # the bound computed from the disk: half of its free space and what the cache holds, at most 50 GB
    monkeypatch.delenv("DSCONVERT_CACHE_SIZE")
    folder, bound = default_shard_cache(url, None, None)
    st = os.statvfs(folder)
    expected = min(50 * 10**9, (st.f_bavail * st.f_frsize + nbytes) // 2)
    assert bound >= MIN_CAP and abs(bound - expected) <= expected / 20  # other processes write to the disk too
    assert default_shard_cache(url, None, "1GB") == (folder, 10**9)


def test_no_disk_at_hand_reads_without_a_cache(s3, remote, tmp_path, monkeypatch, torch):
    url, local = remote
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache's folder would be")
    monkeypatch.setenv("DSCONVERT_CACHE", str(blocked))
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    assert ds.access.cache is None and type(ds).__name__ == "StreamDataset"
    assert epoch(torch, ds) == digests([([x], [y]) for x, y in open_dataset(local, decode="raw")])


def test_a_damaged_cached_shard_is_fetched_again(s3, remote, torch):
    url, local = remote
    want = digests([([x], [y]) for x, y in open_dataset(local, decode="raw")])
    ds = open_dataset(url, decode="raw", storage_options=s3.options)
    assert epoch(torch, ds) == want
    files = os.path.join(ds.access.cache.dir, "files")
    copies = sorted(n for n in os.listdir(files) if n.endswith(".tar"))
    cut = os.path.join(files, copies[0])
    with open(cut, "r+b") as f:  # cut short: a disk that lost its tail
        f.truncate(os.path.getsize(cut) // 2)
    unmarked = os.path.join(files, copies[1])
    with open(unmarked, "r+b") as f:  # overwritten in place, its verification lost
        f.seek(2048)
        f.write(b"garbage" * 100)
    os.remove(unmarked + MARKER)
    flipped = os.path.join(files, copies[2])
    with open(flipped, "r+b") as f:  # one byte changed in place, its marker kept (a disk's bit flip)
        f.seek(1024)
        byte = f.read(1)
        f.seek(1024)
        f.write(bytes([byte[0] ^ 1]))
    before = len(shard_reads(s3))
    assert epoch(torch, open_dataset(url, decode="raw", storage_options=s3.options)) == want
    fetched = shard_reads(s3)[before:]
    names = {copy.split("-", 1)[1] for copy in copies[:3]}
    assert {r.split()[1].rsplit("/", 1)[-1] for r in fetched} == names  # those three again, nothing else
    for copy in copies[:3]:
        data = open(os.path.join(files, copy), "rb").read()
        assert data == open(os.path.join(local, copy.split("-", 1)[1]), "rb").read()


READER = """
import hashlib, sys, torch
from dsconvert import open_dataset
sys.path.insert(0, sys.argv[3])
import s3server
ds = open_dataset(sys.argv[1], decode="raw", storage_options=s3server.storage_options(sys.argv[2]))
assert ds.access.cache is not None
loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                     collate_fn=lambda s: [hashlib.sha1(bytes(x)).hexdigest() for x, _ in s])
print(" ".join(sorted(h for batch in loader for h in batch)))
"""


def test_processes_sharing_the_default_cache_leave_it_whole(s3, remote, tmp_path, torch):
    url, local = remote
    script = tmp_path / "reader.py"
    script.write_text(READER)
    support = os.path.join(ROOT, "tests", "support")
    procs = [subprocess.Popen([sys.executable, str(script), url, s3.endpoint, support], stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]  # 3 jobs x 2 workers at once
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    want = sorted(hashlib.sha1(bytes(x)).hexdigest() for x, _ in open_dataset(local, decode="raw"))
    assert outs == [want] * 3 and all(p.returncode == 0 for p in procs)
    files = os.path.join(cache_home(), "shards", "files")
    names = os.listdir(files)
    assert not [n for n in names if n.endswith(".tmp")]
    copies = [n for n in names if not n.endswith(MARKER)]
    assert len(copies) == len(output_files(local))  # each file once, whole and checked
    for copy in copies:
        original = os.path.join(local, copy.split("-", 1)[1])
        assert open(os.path.join(files, copy), "rb").read() == open(original, "rb").read()
        assert open(os.path.join(files, copy + MARKER)).read().split()[0] == hashlib.sha256(
            open(original, "rb").read()).hexdigest()
