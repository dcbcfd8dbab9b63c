"""Offline reads from the cache (issue 35, item 5): a remote output fully in ``cache_dir`` opens
and reads to the end with its S3 server stopped, its manifest kept in the cache and checked
against its own sha256; an edited or partial cache is refused; while the server answers, its
manifest wins.

Each test runs its own moto S3 server on 127.0.0.1 (the session's is shared, and these stop
theirs). The client is told to try once, so that each read of the stopped server fails at once
rather than after botocore's retries.
"""

import hashlib
import json
import os
import shutil
import warnings

import pytest

from dsconvert import ManifestError, OfflineCacheWarning, convert, open_dataset
from dsconvert.cli import main

from conftest import make_image_folder, s3server

pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'dsconvert[s3]')")
pytest.importorskip("moto.server", reason="moto[server] is not installed")


class Server:
    """One moto S3 server of this test's own, which the test stops."""

    def __init__(self):
        import s3fs

        self.proc, self.endpoint = s3server.start()
        self.options = dict(s3server.storage_options(self.endpoint),
                            config_kwargs={"retries": {"max_attempts": 1}})
        self.fs = s3fs.S3FileSystem(**self.options, skip_instance_cache=True)
        self.fs.mkdir("bucket")

    def put(self, local, key):
        self.fs.put(local, f"bucket/{key}", recursive=True)
        self.fs.rm_file(f"bucket/{key}/.dsconvert.lock")
        return f"s3://bucket/{key}"

    def stop(self):
        if self.proc is not None:
            s3server.stop(self.proc)
            self.proc = None


@pytest.fixture
def server(monkeypatch):
    for key, value in s3server.CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    srv = Server()
    yield srv
    srv.stop()


def sample_digests(ds):
    """sha1 of every sample's bytes, with its label, in the dataset's order."""
    return [(hashlib.sha1(bytes(x)).hexdigest(), y) for x, y in ds]


def make_output(tmp_path, photos, name, classes, seed=0):
    src = str(tmp_path / f"src-{name}")
    make_image_folder(src, photos, classes, seed=seed, size=(40, 32))
    out = str(tmp_path / name)
    convert(src, out, "wds", samples_per_shard=5, workers=1)
    return out


def read_all(url, server, cache, **kw):
    return sample_digests(open_dataset(url, decode="raw", storage_options=server.options, cache_dir=cache, **kw))


def test_a_fully_cached_output_reads_to_the_end_with_the_server_stopped(server, tmp_path, photos, torch):
    local = make_output(tmp_path, photos, "out", {"a": 7, "b": 6, "c": 5})
    assert json.load(open(os.path.join(local, "dsconvert.json")))["order"]  # a shuffled output: its order file too
    url = server.put(local, "train")
    want = sample_digests(open_dataset(local, decode="raw"))
    cache = str(tmp_path / "cache")
    with warnings.catch_warnings():
        warnings.simplefilter("error", OfflineCacheWarning)  # the server answers: not said
        assert main(["cache", url, cache, "--quiet", "--storage-option",
                     f"client_kwargs.endpoint_url={server.endpoint}"]) == 0  # `dsconvert cache` keeps the manifest too
    server.stop()

    with pytest.warns(OfflineCacheWarning, match="cannot be reached.*reading it from the cache") as said:
        ds = open_dataset(url, decode="raw", storage_options=server.options, cache_dir=cache)
    assert len(said) == 1 and "EndpointConnectionError" in str(said[0].message)
    assert said[0].filename == __file__  # the line that opened it
    assert sample_digests(ds) == want  # every sample, in the source's order
    loader = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True, num_workers=2,
                                         collate_fn=lambda batch: batch)
    assert sorted(s for batch in loader for s in sample_digests(batch)) == sorted(want)
    with pytest.warns(OfflineCacheWarning):  # streamed too, by rank
        stream = open_dataset(url, decode="raw", storage_options=server.options, cache_dir=cache,
                              stream=True, rank=1, world_size=2, even=None)
    with pytest.warns(OfflineCacheWarning):
        other = open_dataset(url, decode="raw", storage_options=server.options, cache_dir=cache,
                             stream=True, rank=0, world_size=2, even=None)
    assert sorted(sample_digests(stream) + sample_digests(other)) == sorted(want)


def test_an_edited_or_partial_cache_is_not_trusted(server, tmp_path, photos):
    local = make_output(tmp_path, photos, "out", {"a": 6, "b": 6})
    url = server.put(local, "train")
    pristine = str(tmp_path / "pristine")
    want = read_all(url, server, pristine)  # a first epoch fills the cache
    server.stop()
    manifest = json.load(open(os.path.join(local, "dsconvert.json")))

    def variant(name):
        cache = str(tmp_path / name)
        shutil.copytree(pristine, cache)
        (kept,) = [os.path.join(cache, "kept", n) for n in os.listdir(os.path.join(cache, "kept"))
                   if n.endswith("dsconvert.json")]
        return cache, kept

    with pytest.warns(OfflineCacheWarning):
        assert read_all(url, server, variant("intact")[0]) == want

    cache, kept = variant("edited")  # the manifest's copy edited (its digest left as it was)
    edited = json.loads(open(kept, "rb").read())
    edited["classes"] = ["x", "y"]
    open(kept, "w").write(json.dumps(edited))
    with pytest.raises(ManifestError, match="does not match its sha256"):
        read_all(url, server, cache)

    cache, kept = variant("re-signed")  # edited to name other shard bytes, its digest made to match
    edited = json.loads(open(kept, "rb").read())
    edited["shards"][0]["sha256"] = hashlib.sha256(b"other bytes").hexdigest()
    data = json.dumps(edited).encode()
    open(kept, "wb").write(data)
    open(kept + ".sha256", "w").write(hashlib.sha256(data).hexdigest())
    first = manifest["shards"][0]["name"]
    with pytest.raises(ManifestError, match=f"1 of its files .* do not match its manifest .*{first}"):
        read_all(url, server, cache)

    cache, _ = variant("damaged")  # a shard's copy changed, its verification lost
    (copy,) = [os.path.join(cache, "files", n) for n in os.listdir(os.path.join(cache, "files"))
               if n.endswith(manifest["shards"][1]["name"])]
    with open(copy, "r+b") as f:
        f.write(b"garbage")
    os.remove(copy + ".sha256")
    with pytest.raises(ManifestError, match=manifest["shards"][1]["name"]):
        read_all(url, server, cache)

    cache, _ = variant("partial")  # a shard evicted (or never read)
    os.remove(copy.replace(str(tmp_path / "damaged"), cache))
    with pytest.raises(ManifestError, match="1 of its files are not in the cache"):
        read_all(url, server, cache)

    with pytest.raises(Exception, match="Could not connect") as never:  # never read while reachable
        read_all(url, server, str(tmp_path / "empty"))
    assert not isinstance(never.value, ManifestError)


def test_the_servers_manifest_wins_while_it_answers(server, tmp_path, photos):
    first = make_output(tmp_path, photos, "first", {"a": 5, "b": 5})
    url = server.put(first, "train")
    cache = str(tmp_path / "cache")
    assert read_all(url, server, cache) == sample_digests(open_dataset(first, decode="raw"))
    second = make_output(tmp_path, photos, "second", {"a": 4, "b": 4, "c": 4}, seed=1)  # a newer conversion
    server.fs.rm("bucket/train", recursive=True)
    server.put(second, "train")
    want = sample_digests(open_dataset(second, decode="raw"))
    assert want != sample_digests(open_dataset(first, decode="raw"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", OfflineCacheWarning)
        assert read_all(url, server, cache) == want  # the server's manifest, not the cache's
    server.stop()
    with pytest.warns(OfflineCacheWarning):
        assert read_all(url, server, cache) == want  # and offline, the newer one it kept


@pytest.fixture
def read_only():
    """Makes a folder read-only where it stands with a real read-only bind mount (as root);
    unmounted after the test."""
    import gc
    import subprocess

    mounts = []

    def make(folder):
        if os.geteuid() != 0:
            pytest.skip("a read-only bind mount needs root")
        for argv in (["mount", "--bind", folder, folder], ["mount", "-o", "remount,bind,ro", folder]):
            done = subprocess.run(argv, capture_output=True, text=True)
            if done.returncode:
                if mounts and mounts[-1] == folder:
                    subprocess.run(["umount", folder], check=False)
                    mounts.pop()
                pytest.skip(f"no read-only bind mount here: {done.stderr.strip()[:200]}")
            if argv[1] == "--bind":
                mounts.append(folder)
        with pytest.raises(OSError):  # really read-only, for root too
            open(os.path.join(folder, "probe"), "w")

    yield make
    gc.collect()  # datasets holding the mount's files open
    for folder in reversed(mounts):
        if subprocess.run(["umount", folder], capture_output=True).returncode:
            subprocess.run(["umount", "-l", folder], check=False)


def test_a_full_cache_on_a_read_only_file_system_reads(server, tmp_path, photos, read_only):
    """Issue 40, item 11, the whole class: a cache filled and verified, then mounted read-only,
    reads every format map-style and streamed, with a size cap, with a copy whose marker is gone
    (checked by hash, nothing recorded), online (the manifest kept already) and offline (the
    server stopped); what it lacks fails in one line naming the copy, never EROFS from a lock."""
    classes = {"a": 7, "b": 6, "c": 5}
    local = {fmt: str(tmp_path / fmt) for fmt in ("wds", "hdf5", "npy")}
    src = str(tmp_path / "src")
    make_image_folder(src, photos, classes, size=(40, 32))
    for fmt, out in local.items():
        convert(src, out, fmt, samples_per_shard=5, workers=1)
    decode = {"wds": "raw", "hdf5": "raw", "npy": "numpy"}  # npy stores pixels
    want = {fmt: sample_digests(open_dataset(out, decode=decode[fmt])) for fmt, out in local.items()}
    url = server.put(local["wds"], "train")
    cache = str(tmp_path / "cache")
    readers = [(fmt, dict(path=out)) for fmt, out in local.items()]
    readers += [("wds", dict(path=local["wds"], stream=True)), ("wds", dict(path=local["wds"], cache_size="1GB")),
                ("wds", dict(path=url, storage_options=server.options)),
                ("wds", dict(path=url, storage_options=server.options, stream=True))]

    def read(fmt, kw):
        kw = dict(kw)
        got = sample_digests(open_dataset(kw.pop("path"), decode=decode[fmt], cache_dir=cache, **kw))
        assert sorted(got) == sorted(want[fmt]) and (kw.get("stream") or got == want[fmt])

    for fmt, kw in readers:  # fill and verify
        read(fmt, kw)
    files = os.path.join(cache, "files")
    shard = sorted(f for f in os.listdir(files) if f.endswith(".tar"))
    os.remove(os.path.join(files, shard[0] + ".sha256"))  # a copy never marked: hashed on each read
    before = {f: os.stat(os.path.join(files, f)).st_mtime_ns for f in os.listdir(files)}
    read_only(cache)
    for fmt, kw in readers:  # online: the output (or the server) answers; nothing is written
        read(fmt, kw)
    server.stop()
    for stream in (False, True):  # offline
        with pytest.warns(OfflineCacheWarning):
            read("wds", dict(path=url, storage_options=server.options, stream=stream))
    assert before == {f: os.stat(os.path.join(files, f)).st_mtime_ns for f in os.listdir(files)}

    # what a read-only cache lacks: one line naming the copy
    lacking = str(tmp_path / "lacking")
    shutil.copytree(cache, lacking)
    # the local output's copy of shard 1 (the cache also holds the server's copies: which sorts
    # first by its URL's digest is chance, so it is named by its URL, not by its place)
    from dsconvert.io.location import Location
    from dsconvert.io.shard_cache import ShardCache

    victim = os.path.basename(ShardCache(str(tmp_path / "scratch"))._local_path(
        Location(local["wds"]).url_of("shard-000001.tar")))
    assert victim in shard
    os.remove(os.path.join(lacking, "files", victim))
    read_only(lacking)
    ds = open_dataset(local["wds"], decode="raw", cache_dir=lacking)
    with pytest.raises(OSError, match="cannot be written.*holds no verified copy") as err:
        sample_digests(ds)
    assert "\n" not in str(err.value) and "shard-000001.tar" in str(err.value)
