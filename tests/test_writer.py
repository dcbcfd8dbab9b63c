"""dsconvert.Writer and dsconvert.optimize against the real readers: open_dataset, webdataset,
verify, a real process pool and a real SIGKILL.

Tiers (integ's markers): the SIGKILL job, the Dask cluster and the docs blocks run processes of
their own and take seconds (slow, system); the rest is the fast tier (the first import of
webdataset, which imports torch, is most of its time)."""

import glob
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

import dsconvert
from dsconvert import BadInputError, OptionError, OutputExistsError, Writer, open_dataset, optimize
from dsconvert.verify import verify

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
_PHOTOS = {}


def _photo(i):
    """A real photograph, cropped and resized by the input index (loaded once per process)."""
    if not _PHOTOS:
        from dsconvert.demo import load_photos

        _PHOTOS.update(load_photos(("astronaut", "camera", "chelsea", "coffee", "rocket")))
    names = sorted(_PHOTOS)
    photo = _PHOTOS[names[i % len(names)]].convert("RGB")
    w, h = photo.size
    box = (i % 7 * 10, i % 5 * 10, w - i % 3 * 20, h - i % 4 * 20)
    return photo.crop(box).resize((64 + i % 3 * 8, 48 + i % 2 * 8))


def make_sample(i):
    """A LitData-style fn: one input index -> one sample of many value kinds."""
    return {"jpg": _photo(i), "cls": i % 3, "json": {"index": i, "tags": ["a", "b"]}, "txt": f"caption {i}",
            "npy": np.arange(i, i + 6, dtype=np.int16).reshape(2, 3)}


def make_labelled(i):
    return {"png": np.asarray(_photo(i)), "cls": i % 4}


def _digests(out):
    """Every file of an output but the owner journal and lock (whose token differs by run)."""
    return {name: hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(out)) if not name.startswith(".")}


def _wds(out):
    import webdataset

    urls = sorted(glob.glob(os.path.join(out, "*.tar")))
    return list(webdataset.WebDataset(urls, shardshuffle=False))


def _all(ds):
    return [ds[i] for i in range(len(ds))] if hasattr(ds, "__getitem__") else list(ds)


def test_optimize_on_two_workers_equals_one_byte_for_byte(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    r1 = optimize(make_sample, range(40), one, workers=1, samples_per_shard=8)
    r2 = optimize(make_sample, range(40), two, workers=2, samples_per_shard=8)
    assert r1.manifest.num_samples == r2.manifest.num_samples == 40
    assert len(r1.manifest.shards) == 5 and r1.manifest.sample_type == "dict"
    assert _digests(one) == _digests(two)
    assert verify(two)["ok"]
    again = optimize(make_sample, range(40), two, workers=2, samples_per_shard=8)
    assert again.already_complete
    with pytest.raises(OutputExistsError):
        optimize(make_sample, range(41), two, workers=2, samples_per_shard=8)


def test_optimize_output_reads_as_webdataset_reads_it(tmp_path):
    out = str(tmp_path / "out")
    optimize(make_sample, range(20), out, workers=2, samples_per_shard=6)
    ours = {s["__key__"]: s for s in _all(open_dataset(out))}
    theirs = _wds(out)
    assert [s["__key__"] for s in theirs] == [f"{i:08d}" for i in range(20)] == sorted(ours)
    for s in theirs:
        i = int(s["__key__"])
        mine = ours[s["__key__"]]
        assert set(s) - {"__key__", "__url__", "__local_path__"} == {"jpg", "cls", "json", "txt", "npy"}
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(s["jpg"])).convert("RGB")), np.asarray(mine["jpg"]))
        want = io.BytesIO()
        _photo(i).save(want, "JPEG", quality=95)
        assert s["jpg"] == want.getvalue()  # PIL images are encoded as JPEG at quality 95
        assert s["cls"] == str(i % 3).encode() and mine["cls"] == i % 3
        assert json.loads(s["json"]) == mine["json"] == {"index": i, "tags": ["a", "b"]}
        assert s["txt"].decode() == mine["txt"] == f"caption {i}"
        arr = np.load(io.BytesIO(s["npy"]), allow_pickle=False)
        assert np.array_equal(arr, mine["npy"]) and arr.dtype == np.int16 and arr.shape == (2, 3)


def test_writer_output_reads_sample_for_sample_in_open_dataset_and_webdataset(tmp_path):
    out = str(tmp_path / "out")
    with Writer(out, samples_per_shard=4) as w:
        for i in range(10):
            w.write({"__key__": f"clip{i // 5}/frame{i:03d}", "png": np.asarray(_photo(i)),
                     "seg.png": _photo(i).convert("L"), "json": {"frame": i}, "bin": bytes([i]) * 3})
    m = w.manifest
    assert m.num_samples == 10 and len(m.shards) == 3 and m.sample_type == "dict"
    assert verify(out)["ok"]
    theirs = _wds(out)
    ours = _all(open_dataset(out))
    assert [s["__key__"] for s in theirs] == [s["__key__"] for s in ours] == \
        [f"clip{i // 5}/frame{i:03d}" for i in range(10)]
    for i, (t, o) in enumerate(zip(theirs, ours)):
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(t["png"]))), np.asarray(_photo(i)))  # PNG: lossless
        assert np.array_equal(np.asarray(o["png"]), np.asarray(_photo(i)))
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(t["seg.png"]))), np.asarray(_photo(i).convert("L")))
        assert json.loads(t["json"]) == o["json"] == {"frame": i}
        assert t["bin"] == bytes([i]) * 3


def test_writer_image_and_cls_samples_are_image_label_pairs(tmp_path):
    out = str(tmp_path / "out")
    with Writer(out, classes=["cat", "dog"], samples_per_shard=3) as w:
        for i in range(7):
            w.write({"jpg": _photo(i), "cls": i % 2})
    assert w.manifest.sample_type == "classification" and w.manifest.classes == ["cat", "dog"]
    assert verify(out)["ok"]
    pairs = _all(open_dataset(out))
    theirs = _wds(out)
    assert len(pairs) == len(theirs) == 7
    for i, ((image, label), t) in enumerate(zip(pairs, theirs)):
        assert label == i % 2 and t["cls"] == str(i % 2).encode()
        assert np.array_equal(np.asarray(image), np.asarray(Image.open(io.BytesIO(t["jpg"])).convert("RGB")))


@pytest.mark.parametrize("fmt", ["hdf5", "npy"])
def test_image_label_samples_go_into_every_format(tmp_path, fmt):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    optimize(make_labelled, range(12), one, format=fmt, workers=1, samples_per_shard=5)
    r = optimize(make_labelled, range(12), two, format=fmt, workers=2, samples_per_shard=5)
    assert _digests(one) == _digests(two)
    assert r.manifest.sample_type == "classification" and verify(two)["ok"]
    ds = open_dataset(two)
    for i in range(12):
        image, label = ds[i]
        assert label == i % 4
        assert np.array_equal(np.asarray(image), np.asarray(_photo(i)))  # PNG round trip: the exact pixels


def test_dict_samples_in_a_format_for_image_label_pairs_is_one_clear_error(tmp_path):
    with pytest.raises(OptionError, match="holds \\(image, label\\) samples") as err:
        with Writer(str(tmp_path / "out"), format="hdf5") as w:
            w.write({"jpg": _photo(0), "json": {"a": 1}})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("sample, match", [
    ({"jpg": {1, 2}}, "field 'jpg' takes bytes or a PIL image"),
    ({"json": object()}, "cannot store a object under a json extension"),
    ({"txt": 3.5}, "cannot store a float under a text extension"),
    ({"json": {"x": float("nan")}}, "not JSON-able"),
    ({"a/b": b"x"}, "field name 'a/b' is not a file extension"),
    ({"caption text": "x"}, "field name 'caption text' is not a file extension"),
    ({"__url__": "x"}, "field name '__url__' is not a file extension"),
    ({"pyd": b"x"}, "pickled fields are not written"),
    ({"__key__": "a.b", "txt": "x"}, "is not tar- and webdataset-safe"),
    ({"__key__": 3, "txt": "x"}, "__key__ must be a str"),
    (["jpg", b"x"], "a sample is a dict"),
    ({"jpg": np.zeros((4, 4), np.float32)}, "must be uint8"),
])
def test_bad_values_are_one_line_errors(tmp_path, sample, match):
    with pytest.raises(BadInputError, match=re.escape(match)) as err:
        with Writer(str(tmp_path / "out")) as w:
            w.write(sample)
    assert "\n" not in str(err.value)
    assert not os.path.exists(tmp_path / "out" / "dsconvert.json")


def test_a_key_twice_is_an_error_in_writer_and_optimize(tmp_path):
    with pytest.raises(BadInputError, match="given twice") as err:
        with Writer(str(tmp_path / "w"), samples_per_shard=2) as w:
            for i in range(3):
                w.write({"__key__": "same" if i != 1 else "other", "txt": "x"})
    assert "\n" not in str(err.value)
    with pytest.raises(BadInputError, match="'k0' is given twice"):  # across shards, found at the end
        optimize(same_key, range(4), str(tmp_path / "o"), workers=2, samples_per_shard=2)
    assert not os.path.exists(tmp_path / "o" / "dsconvert.json")


def test_an_exception_in_the_with_block_leaves_no_manifest_and_the_next_writer_replaces_it(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(KeyError):
        with Writer(out, samples_per_shard=2) as w:
            for i in range(5):
                w.write({"txt": f"first {i}"})
            raise KeyError("the user's own error")
    left = sorted(os.listdir(out))
    assert "dsconvert.json" not in left and not [n for n in left if n.endswith(".tmp")]
    assert "shard-000000.tar" in left  # finished shards stay, unlisted
    with Writer(out, samples_per_shard=4) as w:
        for i in range(3):
            w.write({"txt": f"second {i}"})
    assert [s["txt"] for s in _all(open_dataset(out))] == [f"second {i}" for i in range(3)]
    assert sorted(n for n in os.listdir(out) if not n.startswith(".")) == \
        ["dsconvert.json", "shard-000000.idx", "shard-000000.tar"]  # the first run's shards are gone
    assert verify(out)["ok"]
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        with Writer(out) as w:
            w.write({"txt": "third"})
    with Writer(out, overwrite=True) as w:
        w.write({"txt": "third"})
    assert [s["txt"] for s in _all(open_dataset(out))] == ["third"]


def test_a_label_past_the_classes_named_is_an_error(tmp_path):
    with pytest.raises(BadInputError, match="cls 2 is past the 2 classes named"):
        with Writer(str(tmp_path / "out"), classes=["cat", "dog"]) as w:
            w.write({"jpg": _photo(0), "cls": 2})


def test_a_writer_output_converts_like_any_output(tmp_path):
    out, h5 = str(tmp_path / "out"), str(tmp_path / "h5")
    with Writer(out, classes=["a", "b", "c"], samples_per_shard=4) as w:
        for i in range(9):
            w.write({"png": np.asarray(_photo(i)), "cls": i % 3})
    r = dsconvert.convert(out, h5, format="hdf5", workers=1)
    assert r.manifest.num_samples == 9 and r.manifest.classes == ["a", "b", "c"]
    for i, (image, label) in enumerate(_all(open_dataset(h5))):
        assert label == i % 3 and np.array_equal(np.asarray(image), np.asarray(_photo(i)))


def test_no_inputs_make_an_empty_output(tmp_path):
    r = optimize(make_sample, [], str(tmp_path / "out"), workers=2)
    assert r.manifest.num_samples == 0 and r.manifest.shards == [] and verify(str(tmp_path / "out"))["ok"]


def same_key(i):
    return {"__key__": f"k{i % 2}", "txt": str(i)}


def test_a_later_sample_of_another_kind_says_what_to_do(tmp_path):
    with pytest.raises(BadInputError, match="sample_type='dict'"):
        with Writer(str(tmp_path / "out")) as w:
            w.write({"jpg": _photo(0), "cls": 1})
            w.write({"jpg": _photo(1), "cls": 1, "txt": "x"})
    with Writer(str(tmp_path / "out2"), sample_type="dict") as w:  # the fix: both kinds in one dict output
        w.write({"jpg": _photo(0), "cls": 1})
        w.write({"jpg": _photo(1), "cls": 1, "txt": "x"})
    assert w.manifest.sample_type == "dict" and verify(str(tmp_path / "out2"))["ok"]


def skip_odd(i):
    return None if i % 2 else {"txt": str(i)}


def test_none_from_fn_is_a_listed_skip(tmp_path):
    r = optimize(skip_odd, range(10), str(tmp_path / "out"), workers=1, samples_per_shard=4)
    m = r.manifest
    assert m.num_samples == 5 and [s["path"] for s in m.skipped] == [f"inputs/{i}" for i in range(1, 10, 2)]
    assert m.accounting["files_seen"] == 10 and verify(str(tmp_path / "out"))["ok"]


@pytest.mark.slow
@pytest.mark.system
def test_a_dask_executor_gives_the_process_pools_bytes(tmp_path):
    pytest.importorskip("distributed", reason="dask.distributed is not installed (pip install 'dsconvert[dask]')")
    from dsconvert.cluster import cluster_executor

    pool, dask = str(tmp_path / "pool"), str(tmp_path / "dask")
    optimize(make_sample, range(24), pool, workers=2, samples_per_shard=8)
    with cluster_executor("local:2") as executor:
        r = optimize(make_sample, range(24), dask, executor=executor, samples_per_shard=8)
    assert r.manifest.num_samples == 24 and _digests(dask) == _digests(pool)


def fails_at_5(i):
    if i == 5 and not os.environ.get("DSCONVERT_TEST_FIXED"):
        raise ValueError("input 5 is bad")
    return {"txt": str(i)}


def test_an_error_in_fn_is_raised_as_it_is_and_a_rerun_finishes(tmp_path, monkeypatch):
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match="input 5 is bad"):
        optimize(fails_at_5, range(12), out, workers=2, samples_per_shard=4)
    assert not os.path.exists(os.path.join(out, "dsconvert.json"))
    monkeypatch.setenv("DSCONVERT_TEST_FIXED", "1")  # forked workers inherit it
    r = optimize(fails_at_5, range(12), out, workers=2, samples_per_shard=4)
    assert r.manifest.num_samples == 12 and verify(out)["ok"]
    assert sorted(os.listdir(out)) == sorted([".dsconvert.lock", ".dsconvert.owner", "dsconvert.json"]
                                             + [f"shard-{i:06d}.{x}" for i in range(3) for x in ("tar", "idx")])


RESUME_JOB = """
import os, sys, time
sys.path.insert(0, {tests!r})
import dsconvert
from test_writer import make_sample

LOG, BLOCK = sys.argv[2], int(sys.argv[3])

def fn(i):
    with open(LOG, "a") as f:
        f.write(f"{{i}}\\n")
    if i == BLOCK:
        open(LOG + ".blocked", "w").close()
        time.sleep(600)
    return make_sample(i)

if __name__ == "__main__":
    dsconvert.optimize(fn, range(40), sys.argv[1], workers=2, samples_per_shard=8)
"""


def _calls(log):
    with open(log) as f:
        return [int(x) for x in f.read().split()]


@pytest.mark.slow
@pytest.mark.system
def test_a_sigkilled_optimize_resumes_without_recomputing_written_inputs(tmp_path):
    job = tmp_path / "job.py"
    job.write_text(RESUME_JOB.format(tests=HERE))
    out, log = str(tmp_path / "out"), str(tmp_path / "calls.log")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # input 24 (the first of shard 3) blocks: the other worker finishes shards meanwhile
    proc = subprocess.Popen([sys.executable, str(job), out, log, "24"], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 300  # a hang guard, not a measurement
        while not (os.path.exists(log + ".blocked") and len(glob.glob(os.path.join(out, "*.idx"))) >= 3):
            assert proc.poll() is None, "the job ended before it was killed"
            assert time.monotonic() < deadline, "the job did not get to its blocking input"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not os.path.exists(os.path.join(out, "dsconvert.json"))
    finished = sorted(int(re.search(r"(\d+)\.idx", p).group(1)) for p in glob.glob(os.path.join(out, "*.idx")))
    assert 3 not in finished and len(finished) >= 3
    before = len(_calls(log))
    subprocess.run([sys.executable, str(job), out, log, "-1"], env=env, check=True, timeout=300)
    again = sorted(_calls(log)[before:])
    todo = [s for s in range(5) if s not in finished]
    assert again == sorted(i for s in todo for i in range(8 * s, 8 * s + 8))  # written inputs: fn not called
    fresh = str(tmp_path / "fresh")
    subprocess.run([sys.executable, str(job), fresh, str(tmp_path / "fresh.log"), "-1"], env=env, check=True,
                   timeout=300)
    assert _digests(out) == _digests(fresh)  # the resumed output is the uninterrupted one, manifest and all
    assert verify(out)["ok"]


def _python_blocks(path):
    """The ```python blocks of a docs page that use dsconvert (the peers' blocks need their packages)."""
    with open(path) as f:
        text = f.read()
    return [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "dsconvert" in b]


@pytest.mark.slow
@pytest.mark.system
def test_the_dsconvert_blocks_of_docs_writer_md_run_as_written(tmp_path):
    """Each block runs as a script of its own (``python block.py``), as a reader would run it."""
    blocks = _python_blocks(os.path.join(ROOT, "docs", "writer.md"))
    assert len(blocks) >= 3
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for n, block in enumerate(blocks):
        script = tmp_path / f"block{n}.py"
        script.write_text(block)
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"docs/writer.md block {n}:\n{block}\n{done.stderr}"
