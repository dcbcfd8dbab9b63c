"""Remote storage for real: moto's S3 server on 127.0.0.1 through s3fs, and a Dask LocalCluster.

analyze, shard to and from S3 (byte-identical to local runs, resumable), open_dataset with
and without a local cache (verified, capped, shared by processes), dsconvert cache, verify,
storage options from fsspec's environment, and conversion on Dask.
"""

import hashlib
import json
import os
import subprocess
import sys

import pytest

from dsconvert import ManifestError, OptionError, convert, open_dataset
from dsconvert.cli import main
from dsconvert.io.shard_cache import ShardCache
from dsconvert.verify import verify

from conftest import ROOT, make_image_folder, s3server
from support.records import read_record_bytes

pytestmark = pytest.mark.system  # moto's S3 server, a Dask cluster


@pytest.fixture
def local_src(tmp_path, photos):
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"a": 8, "b": 7, "c": 6}, size=(48, 36))
    return root


def local_files(folder):
    return {n: open(os.path.join(folder, n), "rb").read() for n in sorted(os.listdir(folder))
            if not n.startswith(".")}


def same_output(a, b, same_source=True):
    """Shards byte for byte; records too when the source is the same (from another copy of
    it, the spec digest and the files' mtimes differ); manifests but for the source's URL."""
    assert sorted(a) == sorted(b)
    for name in a:
        if name == "dsconvert.json" or (name.endswith(".idx") and not same_source):
            da, db = [json.loads(x[name]) if name.endswith(".json") else read_record_bytes(x[name]) for x in (a, b)]
            for key in ("source", "spec_sha256", "stats"):
                da.pop(key, None), db.pop(key, None)
            if not same_source:  # the manifest carries the records' digests, which then differ
                for shard in da.get("shards", []) + db.get("shards", []):
                    shard.pop("parts", None)
            assert da == db, name
        else:
            assert a[name] == b[name], name


def test_analyze_s3_measures_requests_and_recommends_a_local_cache(s3, local_src, capsys):
    src = s3.put_tree(local_src, "src")
    assert main(["analyze", src, "--json", "--sample", "21", "-q", *s3.cli()]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["storage"] == {"kind": "s3", "fstype": "s3", "mount": f"s3://{s3.bucket}", "latency_bound": True}
    inv = report["inventory"]
    assert (inv["files"], inv["layout"], inv["complete"]) == (21, "imagefolder", True)
    cold = report["read"]["cold_sequential"]
    assert cold["files"] == 21 and cold["latency_ms"]["p50"] > 0
    assert [r["readers"] for r in report["sweep"]][-2:] == [32, 64]
    v = report["verdict"]
    assert v["bottleneck"] in ("storage-latency", "small-files"), v["summary"]
    # the output measured on local disk, named there (the current folder): a command that runs as printed
    assert v["commands"][0].startswith(f"dsconvert shard {src} --format ")
    assert f" -o {os.getcwd()}/src-" in v["commands"][0]
    assert v["alternative"][1].startswith(f"dsconvert cache {src}-wds {os.getcwd()}/dsconvert-cache")


def test_shard_to_and_from_s3_is_byte_identical_and_resumes(s3, local_src, tmp_path, capsys):
    reference = str(tmp_path / "reference")
    convert(local_src, reference, samples_per_shard=5, workers=1)
    src = s3.put_tree(local_src, "src")
    # S3 -> local, through the CLI
    s3_to_local = str(tmp_path / "from-s3")
    assert main(["shard", src, "-o", s3_to_local, "--samples-per-shard", "5", "-q", *s3.cli()]) == 0
    same_output(local_files(s3_to_local), local_files(reference), same_source=False)
    # local -> S3 and S3 -> S3, through the library
    convert(local_src, s3.url("out-local"), samples_per_shard=5, workers=2, storage_options=s3.options)
    convert(src, s3.url("out-s3"), samples_per_shard=5, workers=2, storage_options=s3.options)
    same_output(s3.files("out-local"), local_files(reference))
    same_output(s3.files("out-s3"), local_files(s3_to_local))
    # killed before its manifest, with one shard lost: the same call resumes the rest
    for key in ("dsconvert.json", "shard-000002.tar", "shard-000002.idx"):
        s3.fs.rm_file(f"{s3.bucket}/out-s3/{key}")
    again = convert(src, s3.url("out-s3"), samples_per_shard=5, workers=2, storage_options=s3.options)
    assert (again.shards_resumed, again.shards_written) == (4, 1)
    same_output(s3.files("out-s3"), local_files(s3_to_local))
    assert convert(src, s3.url("out-s3"), samples_per_shard=5, storage_options=s3.options).already_complete


@pytest.fixture
def s3_outputs(s3, local_src, tmp_path):
    """wds, hdf5 and npy outputs on S3, and the samples a local read gives."""
    out = {}
    for fmt in ("wds", "hdf5", "npy"):
        local = str(tmp_path / f"local-{fmt}")
        convert(local_src, local, fmt, samples_per_shard=6, workers=1)
        out[fmt] = (s3.put_tree(local, fmt), local)
        s3.fs.rm_file(f"{s3.bucket}/{fmt}/.dsconvert.lock")
    return out


def digests(ds):
    return sorted(hashlib.sha1(bytes(x) if not hasattr(x, "tobytes") else x.tobytes()).hexdigest() for x, _ in ds)


class Sha1:
    def __call__(self, data):
        return hashlib.sha1(bytes(data)).hexdigest()


def test_open_dataset_from_s3_without_a_cache(s3, s3_outputs, torch):
    url, local = s3_outputs["wds"]
    want = digests(open_dataset(local, decode="raw"))
    assert digests(open_dataset(url, decode="raw", storage_options=s3.options, cache_dir=False)) == want
    ds = open_dataset(url, decode="raw", storage_options=s3.options, transform=Sha1(), cache_dir=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)  # forked workers make their own client
    assert sorted(h for h, _ in loader) == want
    url, local = s3_outputs["hdf5"]  # h5py reads through fsspec's file objects
    remote = open_dataset(url, decode="raw", storage_options=s3.options, cache_dir=False)
    assert [remote[i][0] for i in range(len(remote))] == [x for x, _ in open_dataset(local, decode="raw")]
    url, _ = s3_outputs["npy"]
    with pytest.raises(OptionError, match="cache_dir"):
        open_dataset(url, decode="numpy", storage_options=s3.options, cache_dir=False)[0]
    # by default a remote output is cached (tests/test_default_cache.py), so npy reads too
    assert digests(open_dataset(url, decode="numpy", storage_options=s3.options)) == digests(
        open_dataset(s3_outputs["npy"][1], decode="numpy"))


def test_cache_serves_later_epochs_without_the_store(s3, s3_outputs, tmp_path, torch):
    cache = str(tmp_path / "cache")
    for fmt, decode in (("wds", "raw"), ("npy", "numpy")):
        url, local = s3_outputs[fmt]
        want = digests(open_dataset(local, decode=decode))
        ds = open_dataset(url, decode=decode, storage_options=s3.options, cache_dir=cache)
        if fmt == "wds":
            ds.transform = Sha1()
            got = sorted(h for h, _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))
        else:
            got = digests(ds[i] for i in range(len(ds)))
        assert got == want
        for key in s3.files(fmt):  # everything but the manifest goes from the store
            if key != "dsconvert.json":
                s3.fs.rm_file(f"{s3.bucket}/{fmt}/{key}")
        again = open_dataset(url, decode=decode, storage_options=s3.options, cache_dir=cache)
        assert digests(again if fmt == "wds" else (again[i] for i in range(len(again)))) == want


def test_cache_verifies_copies_against_the_manifest(s3, s3_outputs, tmp_path):
    url, local = s3_outputs["wds"]
    cache = ShardCache(str(tmp_path / "cache"), storage_options=s3.options)
    manifest = json.loads(open(os.path.join(local, "dsconvert.json")).read())
    entry = manifest["shards"][0]
    path = cache.get(f"{url}/{entry['name']}", entry["sha256"], entry["bytes"])
    assert cache.downloads == 1
    with open(path, "r+b") as f:  # a damaged copy whose verification was lost
        f.write(b"garbage")
    os.remove(path + ".sha256")
    path = cache.get(f"{url}/{entry['name']}", entry["sha256"], entry["bytes"])
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == entry["sha256"] and cache.downloads == 2
    s3.fs.pipe(f"{s3.bucket}/wds/{manifest['shards'][1]['name']}", b"not the shard the manifest lists")
    with pytest.raises(ManifestError, match="do not match the manifest's sha256"):
        cache.get(f"{url}/{manifest['shards'][1]['name']}", manifest["shards"][1]["sha256"],
                  manifest["shards"][1]["bytes"])


def test_cache_cap_evicts_least_recently_used(s3, s3_outputs, tmp_path):
    url, local = s3_outputs["wds"]
    sizes = sorted(os.path.getsize(os.path.join(local, n)) for n in os.listdir(local) if n.endswith(".tar"))
    cap = sizes[-1] + sizes[-2] + 2000  # two shards and their indexes, not all four
    cache = str(tmp_path / "cache")
    ds = open_dataset(url, decode="raw", storage_options=s3.options, cache_dir=cache, cache_size=cap)
    assert digests(ds) == digests(open_dataset(local, decode="raw"))
    files, nbytes = ShardCache(cache).usage()
    assert nbytes <= cap and files < 8  # 4 shards + 4 indexes were fetched; the oldest went


READER = """
import hashlib, sys, torch
from dsconvert import open_dataset
sys.path.insert(0, sys.argv[4])
import s3server
ds = open_dataset(sys.argv[1], decode="raw", storage_options=s3server.storage_options(sys.argv[3]),
                  cache_dir=sys.argv[2], transform=lambda b: hashlib.sha1(b).hexdigest())
print(" ".join(sorted(h for h, _ in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2))))
"""


@pytest.mark.usefixtures("torch")  # the readers are subprocesses with DataLoader workers
def test_one_cache_shared_by_processes_and_the_cache_command(s3, s3_outputs, tmp_path, capsys):
    url, local = s3_outputs["wds"]
    cache = str(tmp_path / "cache")
    script = tmp_path / "reader.py"
    script.write_text(READER)
    support = os.path.join(ROOT, "tests", "support")
    procs = [subprocess.Popen([sys.executable, str(script), url, cache, s3.endpoint, support],
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    want = digests(open_dataset(local, decode="raw"))
    assert outs == [want, want] and all(p.returncode == 0 for p in procs)
    assert main(["cache", url, cache, "--json", *s3.cli()]) == 0  # all there already, all verified
    report = json.loads(capsys.readouterr().out)
    assert (report["shards"], report["downloaded"], report["already_cached"]) == (4, 0, 4)
    fresh = str(tmp_path / "fresh")
    assert main(["cache", url, fresh, "--json", *s3.cli()]) == 0
    assert json.loads(capsys.readouterr().out)["downloaded"] == 4
    manifest = json.loads(open(os.path.join(local, "dsconvert.json")).read())
    cached = {hashlib.sha256(open(os.path.join(fresh, "files", n), "rb").read()).hexdigest()
              for n in os.listdir(os.path.join(fresh, "files")) if not n.endswith(".sha256")}
    assert {s["sha256"] for s in manifest["shards"]} <= cached
    assert main(["cache", url, str(tmp_path / "small"), "--max-size", "1kB", *s3.cli()]) == 1
    assert "more than the cache's cap" in capsys.readouterr().err


def test_verify_on_s3(s3, s3_outputs, capsys):
    url, _ = s3_outputs["wds"]
    assert main(["verify", url, "--decode", "-q", *s3.cli()]) == 0
    s3.fs.pipe(f"{s3.bucket}/wds/shard-000001.tar", s3.fs.cat_file(f"{s3.bucket}/wds/shard-000001.tar")[:3000])
    report = verify(url, storage_options=s3.options)
    assert {p["kind"] for p in report["problems"] if p["path"] == "shard-000001.tar"} == {"size", "checksum"}


def test_storage_options_from_fsspec_environment_and_clear_errors(s3, s3_outputs):
    url, _ = s3_outputs["wds"]
    env = dict(os.environ, FSSPEC_S3=json.dumps(s3.options))  # fsspec's own configuration
    run = subprocess.run([sys.executable, "-m", "dsconvert", "info", url], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and "samples:     21" in run.stdout, run.stderr
    closed = s3server.free_port()
    run = subprocess.run([sys.executable, "-m", "dsconvert", "info", url, "--storage-option",
                          f"client_kwargs.endpoint_url=http://127.0.0.1:{closed}", "--storage-option",
                          "config_kwargs.retries.max_attempts=1"], capture_output=True, text=True)
    err = run.stderr.strip().splitlines()
    assert run.returncode == 1 and len(err) == 1 and err[0].startswith("dsconvert: error: storage:"), run.stderr


@pytest.mark.usefixtures("torch")  # bench reads through a DataLoader
def test_bench_reads_s3_before_and_after(s3, local_src, s3_outputs):
    from dsconvert.bench import bench

    src = s3.put_tree(local_src, "src")
    url, _ = s3_outputs["wds"]
    report = bench([src, url], workers=[0], batch_sizes=[4], size=32, max_samples=12, caches=["warm"],
                   storage_options=s3.options)
    assert [d["kind"] for d in report["datasets"]] == ["source", "wds"]
    assert all(r["samples"] == 12 for r in report["runs"])


def test_dask_local_cluster_gives_the_process_pools_bytes(local_src, tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install 'dsconvert[dask]')")
    pool = str(tmp_path / "pool")
    convert(local_src, pool, samples_per_shard=4, workers=2)
    dask = str(tmp_path / "dask")
    assert main(["shard", local_src, "-o", dask, "--samples-per-shard", "4", "--cluster", "local:2", "-q"]) == 0
    assert local_files(dask) == local_files(pool)
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=None, host="127.0.0.1") as cluster:
        running = str(tmp_path / "running")  # a scheduler that is already up, reached by its address
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        assert main(["shard", local_src, "-o", running, "--samples-per-shard", "4", "--cluster",
                     cluster.scheduler_address, "-q"]) == 0
    assert local_files(running) == local_files(pool)
    from dsconvert.cluster import cluster_executor

    with pytest.raises(OptionError, match="tcp://host:port"):
        with cluster_executor("somewhere"):
            pass
