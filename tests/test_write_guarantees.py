"""Issue 40's write-side promises, each tried for its whole class: one writer per output within
a process too (whatever the spelling of the folder), cleanup removes only what the owner journal
proves ours (temporary files included), control files are never followed through links, bad
values and bad options are one-line errors at the moment they are given, field names are
unique as webdataset reads them, and optimize recognises its own inputs in any process."""

import glob
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import dsconvert
from dsconvert import (
    BadInputError,
    OptionError,
    OutputExistsError,
    Writer,
    convert,
    open_dataset,
    optimize,
)
from dsconvert.cli import main
from dsconvert.errors import OutputLockedError
from dsconvert.io.localfs import atomic_write
from dsconvert.io.location import Location
from dsconvert.io.owner import Owned, owner_token, temp_noter
from dsconvert.manifest import MANIFEST_NAME
from dsconvert.verify import verify

from conftest import ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
CONTROL = (".dsconvert.lock", ".dsconvert.owner")


def text_sample(i):
    return {"__key__": f"s{i:04d}", "txt": f"caption {i}", "json": {"i": i}}


def _write(out, n=6, **kw):
    with Writer(out, samples_per_shard=2, **kw) as w:
        for i in range(n):
            w.write(text_sample(i))
    return w.manifest


def _tree(folder):
    """Every file under ``folder`` with its bytes (links as where they point)."""
    got = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        got[name] = ("link", os.readlink(path)) if os.path.islink(path) else open(path, "rb").read()
    return got


# --- 2. one writer per output within a process, whatever the folder's spelling ------------------


def _spellings(tmp_path):
    """The output as given, and the same folder spelled otherwise."""
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "alias").symlink_to(out)
    (tmp_path / "deeper").mkdir()
    (tmp_path / "deeper" / "alias").symlink_to(out)
    return str(out), [str(out), str(tmp_path / "alias"), str(tmp_path / "deeper" / ".." / "alias"),
                      str(tmp_path / "deeper" / "alias") + "/", f"file://{tmp_path / 'alias'}"]


@pytest.mark.parametrize("which", range(5))
def test_a_second_writer_in_one_process_is_refused_whatever_the_spelling(tmp_path, which):
    out, spellings = _spellings(tmp_path)
    first = Writer(out, samples_per_shard=2)
    first.open()
    for i in range(3):
        first.write(text_sample(i))
    second = Writer(spellings[which], samples_per_shard=2)
    with pytest.raises(OutputLockedError, match="another") as err:
        second.open()
    assert "\n" not in str(err.value)
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("a")
    with pytest.raises(OutputLockedError):
        convert(str(src), spellings[which], workers=1)
    with pytest.raises(OutputLockedError):
        optimize(text_sample, range(4), spellings[which], workers=1)
    for i in range(3, 6):
        first.write(text_sample(i))
    first.close()
    assert verify(out)["ok"]
    assert [s["txt"] for s in open_dataset(out)] == [f"caption {i}" for i in range(6)]
    # released on close: the other spelling takes it now (a finished output: replaced only with overwrite)
    _write(spellings[which], overwrite=True)
    assert verify(out)["ok"]


def test_writers_racing_in_threads_on_two_spellings_one_wins(tmp_path):
    out, spellings = _spellings(tmp_path)
    results, barrier = {}, threading.Barrier(len(spellings))

    def run(i, path):
        barrier.wait()
        try:
            with Writer(path, samples_per_shard=2, overwrite=True) as w:
                for j in range(40):
                    w.write({"__key__": f"t{i}-{j:03d}", "txt": f"thread {i} sample {j}"})
            results[i] = "wrote"
        except OutputLockedError:
            results[i] = "locked"

    threads = [threading.Thread(target=run, args=(i, p)) for i, p in enumerate(spellings)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "wrote" in results.values()
    assert verify(out)["ok"]  # whoever wrote, the output maps every key to its own sample
    for s in open_dataset(out):
        i, j = s["__key__"][1:].split("-")
        assert s["txt"] == f"thread {i} sample {int(j)}"


# --- 5. cleanup removes only what the owner journal proves ours, temporary files included -------

USERS_TEMPS = [".shard-000000.tar.1.tmp", ".shard-000001.tar.4242.tmp", ".shard-000000.index.json.77.tmp",
               ".dsconvert.json.12.tmp", ".dsconvert.order.npy.3.tmp", ".shard-000000.tar.0123456789abcdef.tmp",
               ".dsconvert.json.fedcba9876543210.tmp", "..dsconvert.owner.0011223344556677.tmp"]


def _unfinished(tmp_path, how):
    """An output whose run was killed before its manifest, made by ``how``."""
    out = str(tmp_path / "out")
    if how == "convert":
        src = tmp_path / "src"
        src.mkdir()
        for i in range(6):
            (src / f"f{i}.txt").write_text(f"text {i}")
        convert(str(src), out, workers=1, samples_per_shard=2)
        rerun = lambda: convert(str(src), out, workers=1, samples_per_shard=3)  # noqa: E731
    elif how == "Writer":
        _write(out)
        rerun = lambda: _write(out, n=4, overwrite=True)  # noqa: E731
    else:
        optimize(text_sample, range(6), out, workers=1, samples_per_shard=2)
        rerun = lambda: optimize(text_sample, range(6), out, workers=1, samples_per_shard=3)  # noqa: E731
    os.remove(os.path.join(out, MANIFEST_NAME))
    return out, rerun


@pytest.mark.parametrize("how", ["convert", "Writer", "optimize"])
def test_files_named_like_temporary_files_stay_unless_the_journal_names_them(tmp_path, how):
    out, rerun = _unfinished(tmp_path, how)
    for name in USERS_TEMPS:
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"the user's " + name.encode())
    rerun()
    for name in USERS_TEMPS:
        with open(os.path.join(out, name), "rb") as f:
            assert f.read() == b"the user's " + name.encode(), name


@pytest.mark.parametrize("how", ["convert", "Writer", "optimize"])
def test_a_killed_writers_temporary_file_is_journalled_first_and_removed(tmp_path, how):
    out, rerun = _unfinished(tmp_path, how)
    loc = Location(out)
    token = owner_token(loc)
    pid = os.fork()
    if pid == 0:  # a writer killed mid-write: its temporary file stays behind
        try:
            with atomic_write(os.path.join(out, "shard-000009.tar"), before=temp_noter(loc, token)) as f:
                f.write(b"half a shard")
                f.flush()
                os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert status == 0
    left = [n for n in os.listdir(out) if n.endswith(".tmp")]
    assert len(left) == 1 and Owned(loc, token).proves_temp(left[0])
    os.replace(os.path.join(out, left[0]), os.path.join(out, "moved"))  # a link in its place is not removed
    os.symlink(os.path.join(out, "moved"), os.path.join(out, left[0]))
    assert not Owned(loc, token).proves_temp(left[0])
    os.remove(os.path.join(out, left[0]))
    os.replace(os.path.join(out, "moved"), os.path.join(out, left[0]))
    rerun()
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


def test_a_temporary_name_is_never_a_file_already_there(tmp_path):
    """A temp file is created exclusively, never through a link: what is already there (a
    user's file, a link to one) is neither written nor, on failure, removed."""
    target = tmp_path / "elsewhere"
    target.write_bytes(b"precious")
    names = []

    def taken(name):
        names.append(name)
        os.symlink(target, tmp_path / name)  # someone puts a link where the temp file goes

    with pytest.raises(FileExistsError):
        with atomic_write(str(tmp_path / "shard-000000.tar"), before=taken) as f:
            f.write(b"x")
    assert target.read_bytes() == b"precious" and os.path.islink(tmp_path / names[0])


# --- 6. control files are never followed through links ----------------------------------------


def _source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        (src / f"f{i}.txt").write_text(f"text {i}")
    return str(src)


def _runs(src):
    """Every way to write an output (each with overwrite)."""
    return {"convert": lambda out: convert(src, out, workers=1, overwrite=True),
            "Writer": lambda out: _write(out, overwrite=True),
            "optimize": lambda out: optimize(text_sample, range(4), out, workers=1, overwrite=True),
            "cli": lambda out: main(["shard", src, "-o", out, "--overwrite", "-q"])}


@pytest.mark.parametrize("how", ["convert", "Writer", "optimize", "cli"])
def test_a_copy_made_with_cp_rs_never_writes_into_the_original(tmp_path, how, capsys):
    src = _source(tmp_path)
    original, copy = str(tmp_path / "original"), str(tmp_path / "copy")
    convert(src, original, workers=1)
    before = _tree(original)
    subprocess.run(["cp", "-rs", original, copy], check=True)
    capsys.readouterr()
    run = _runs(src)[how]
    if how == "cli":
        assert run(copy) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "symbolic link" in err[0], err
    else:
        with pytest.raises(OutputExistsError, match="symbolic link") as e:
            run(copy)
        assert "\n" not in str(e.value)
    assert _tree(original) == before
    assert verify(original)["ok"]


def _plant(out, name, kind, tmp_path):
    path = os.path.join(out, name)
    outside = tmp_path / "outside"
    outside.mkdir(exist_ok=True)
    if kind == "dangling link":
        os.symlink(outside / f"made-{name}", path)
    elif kind == "link to a file":
        (outside / f"file-{name}").write_bytes(b"someone's file")
        os.symlink(outside / f"file-{name}", path)
    elif kind == "link to another output's":
        other = tmp_path / "other"
        if not other.exists():
            _write(str(other))
        os.symlink(other / name, path)
    elif kind == "folder":
        os.mkdir(path)
    elif kind == "fifo":
        os.mkfifo(path)


@pytest.mark.parametrize("name", CONTROL)
@pytest.mark.parametrize("kind", ["dangling link", "link to a file", "link to another output's", "folder", "fifo"])
@pytest.mark.parametrize("state", ["empty", "unfinished", "finished"])
@pytest.mark.parametrize("how", ["convert", "Writer", "optimize"])
def test_a_control_file_that_is_not_a_regular_file_is_refused(tmp_path, name, kind, state, how):
    src = _source(tmp_path)
    out = str(tmp_path / "out")
    if state == "empty":
        os.mkdir(out)
    else:
        _write(out)
        if state == "unfinished":
            os.remove(os.path.join(out, MANIFEST_NAME))
        os.remove(os.path.join(out, name))
    _plant(out, name, kind, tmp_path)
    other = tmp_path / "other"
    other_before = _tree(str(other)) if other.exists() else None
    with pytest.raises(OutputExistsError, match="symbolic link or not a regular file") as e:
        _runs(src)[how](out)
    assert "\n" not in str(e.value) and name in str(e.value)
    assert sorted(os.listdir(tmp_path / "outside")) == sorted(
        n for n in os.listdir(tmp_path / "outside") if n.startswith("file-"))  # nothing made outside OUT
    if other_before is not None:
        assert _tree(str(other)) == other_before


# --- 8. values that cannot be stored: one line naming the field --------------------------------


def _nested(depth, kind):
    value = leaf = [] if kind == "list" else {}
    for _ in range(depth):
        inner = [] if kind == "list" else {}
        if isinstance(leaf, list):
            leaf.append(inner)
        else:
            leaf["k"] = inner
        leaf = inner
    return value


BAD_VALUES = [
    ({"json": _nested(5000, "list")}, "json", "nested too deeply"),
    ({"json": _nested(5000, "dict")}, "json", "nested too deeply"),
    ({"json": {"a": [1, {"b": _nested(3000, "list")}]}}, "json", "nested too deeply"),
    ({"txt": "\ud800"}, "txt", "lone surrogate"),
    ({"txt": "caption \udfff end"}, "txt", "lone surrogate"),
    ({"caption.txt": "a\udc80"}, "caption.txt", "lone surrogate"),
    ({"cls": "\ud83d"}, "cls", "lone surrogate"),
    ({"json": {"text": "x\ud800"}}, "json", "lone surrogate"),
    ({"json": {"\udc00": 1}}, "json", "lone surrogate"),
    ({"json": ["ok", ["\ud800"]]}, "json", "lone surrogate"),
    ({"__key__": "a/b\ud800", "txt": "x"}, "__key__", "lone surrogate"),
]


@pytest.mark.parametrize("sample,field,match", BAD_VALUES, ids=[f"{i}-{b[1]}" for i, b in enumerate(BAD_VALUES)])
def test_values_that_cannot_be_stored_are_one_line_errors_naming_the_field(tmp_path, sample, field, match):
    out = str(tmp_path / "out")
    with Writer(out, samples_per_shard=2) as w:
        w.write(text_sample(0))
        with pytest.raises(BadInputError, match=match) as err:
            w.write(sample)
        assert "\n" not in str(err.value) and (f"field {field!r}" in str(err.value) or field == "__key__")
        w.write(text_sample(1))  # the Writer goes on
    assert verify(out)["ok"] and len(open_dataset(out)) == 2


def bad_value(i):
    return dict(BAD_VALUES[i][0])


def test_optimize_names_the_field_too(tmp_path):
    for i, (_, field, match) in enumerate(BAD_VALUES):
        with pytest.raises(BadInputError, match=match) as err:
            optimize(bad_value, [i], str(tmp_path / f"o{i}"), workers=1)
        assert "\n" not in str(err.value) and field in str(err.value)


# --- 9. options are checked when the Writer is made ---------------------------------------------

BAD_OPTIONS = [
    {"classes": [1, 2]}, {"classes": ["cat", None]}, {"classes": "cats"}, {"classes": {"cat", "dog"}},
    {"classes": ["cat", "cat"]}, {"classes": []}, {"classes": [b"cat"]}, {"classes": 3},
    {"shard_size": -1}, {"shard_size": 0}, {"shard_size": 1.5}, {"shard_size": None}, {"shard_size": True},
    {"shard_size": "lots"}, {"decode": "yes"}, {"decode": None}, {"overwrite": "no"}, {"overwrite": 1},
    {"storage_options": 5}, {"storage_options": [("anon", True)]}, {"prefix": 5}, {"prefix": "a/b"},
    {"format": ["wds"]}, {"format": None}, {"sample_type": None}, {"sample_type": ["dict"]},
    {"quality": 0}, {"quality": 95.0}, {"samples_per_shard": 0}, {"samples_per_shard": "10"},
    {"compress": 5}, {"compress": "gzip"},
]


@pytest.mark.parametrize("options", BAD_OPTIONS, ids=[repr(o) for o in BAD_OPTIONS])
def test_a_bad_writer_option_is_refused_when_the_writer_is_made(tmp_path, options):
    out = str(tmp_path / "out")
    with pytest.raises(OptionError) as err:
        Writer(out, **options)
    assert "\n" not in str(err.value) and os.path.basename(out) not in os.listdir(tmp_path)  # nothing made


def never_called(i):
    raise AssertionError("fn ran with a bad option")


OPTIMIZE_ONLY = [{"workers": 0}, {"workers": "2"}, {"workers": 1.0}, {"min_shards": 0}, {"progress": "yes"},
                 {"executor": object()}]


@pytest.mark.parametrize("options", [o for o in BAD_OPTIONS if "shard_size" not in o] + OPTIMIZE_ONLY,
                         ids=[repr(o) for o in BAD_OPTIONS if "shard_size" not in o] + [repr(o) for o in OPTIMIZE_ONLY])
def test_a_bad_optimize_option_is_refused_before_fn_runs(tmp_path, options):
    out = str(tmp_path / "out")
    with pytest.raises(OptionError) as err:
        optimize(never_called, range(3), out, **options)
    assert "\n" not in str(err.value) and not os.path.exists(out)


def test_good_class_names_are_kept_in_label_order(tmp_path):
    out = str(tmp_path / "out")
    image = np.zeros((8, 8, 3), np.uint8)
    with Writer(out, classes=("zebra", "ant")) as w:
        w.write({"png": image, "cls": 1})
    assert open_dataset(out).classes == ["zebra", "ant"]


# --- 12. field names are unique as webdataset reads them (it lowercases them) ---------------------

CASE_FIELDS = [
    ({"txt": "a", "TXT": "b"}, None), ({"A_B": "a", "a_b": "b"}, None), ({"Txt": "a", "tXt": "b"}, None),
    ({"seg.PNG": b"a", "seg.png": b"b"}, None), ({"json": {}, "JSON": []}, None), ({"cls": 1, "CLS": 2}, None),
    ({"txt": "a", "TXT.zst": b"b"}, "zstd"), ({"json": {"a": 1}, "JSON.ZST": b"b"}, "zstd"),
    ({"txt": "a", "Txt.Zst": b"b"}, "zstd"), ({"txt": "a", "txt.zst": b"b"}, "zstd"),
    # one name each as webdataset reads them: written, and read back alike by both
    ({"TXT": "upper", "Json": {"a": 1}}, None), ({"A_B": "a", "a_c": "b"}, None), ({"txt": "a", "TXT.zst": b"z"}, None),
    ({"Seg.PNG": b"x", "TXT": "y", "Json": [1]}, "zstd"),
]


@pytest.mark.parametrize("fields,compress", CASE_FIELDS, ids=[",".join(f) + f"-{c}" for f, c in CASE_FIELDS])
def test_field_names_that_webdataset_would_merge_are_refused_and_others_read_alike(tmp_path, fields, compress):
    """Refused at write (two names one as webdataset reads them), or, under compress, a field
    and its .zst twin a counted skip (as conversion does) naming the member; whatever is
    written, webdataset reads with the field names dsconvert reads."""
    pytest.importorskip("webdataset")
    if compress:
        pytest.importorskip("zstandard")
    import webdataset

    out = str(tmp_path / "out")
    refused = False
    with Writer(out, compress=compress) as w:
        w.write({"__key__": "k0", "txt": "first"})
        try:
            w.write({"__key__": "k1", **fields})
        except BadInputError as exc:
            assert "\n" not in str(exc) and all(repr(n) in str(exc) for n in fields), str(exc)
            refused = True
        w.write({"__key__": "k2", "json": {"last": True}})
    m = dsconvert.Manifest.load(out)
    if not refused and m.num_samples == 2:  # the twin skip
        (skip,) = m.skipped
        assert compress and "would both be stored as member" in skip["reason"], skip
    urls = sorted(glob.glob(os.path.join(out, "*.tar")))
    theirs = list(webdataset.WebDataset(urls, shardshuffle=False))  # raises on a duplicate field name
    ours = list(open_dataset(out, decode="raw"))
    assert [t["__key__"] for t in theirs] == [o["__key__"] for o in ours]
    stored = {n + ".zst" if compress and n in ("txt", "json") else n for n in (f.lower() for f in fields)}
    for t, o in zip(theirs, ours):
        names = {n for n in o if not n.startswith("__")}
        assert {n for n in t if not n.startswith("__")} == (
            {n + ".zst" if compress and n in ("txt", "json") else n for n in names})
        if t["__key__"] == "k1":
            assert not refused and names == {n.lower() for n in fields} and set(t) - {"__key__", "__url__",
                                                                                      "__local_path__"} == stored


# --- 13. optimize recognises its inputs in every process ---------------------------------------

FINGERPRINT_JOB = """
import dataclasses, sys
sys.path.insert(0, {tests!r})
import dsconvert


@dataclasses.dataclass
class Holder:
    tags: set


class Tags(frozenset):
    pass


def fn(x):
    return {{"txt": repr(type(x).__name__)}}


INPUTS = {{
    "sets": [{{"cat", "dog", "emu", "fox", f"n{{i}}"}} for i in range(6)],
    "frozensets in tuples": [("x", frozenset({{"p", "q", "r", str(i)}})) for i in range(6)],
    "dicts of sets": [{{"tags": {{"a", "b", "c"}}, "i": i, "nested": [{{"u", "v"}}, set()]}} for i in range(6)],
    "objects holding sets": [Holder({{"s1", "s2", f"s{{i + 3}}"}}) for i in range(6)],
    "set subclasses": [Tags({{"u", "v", "w", str(i)}}) for i in range(6)],
    "sets of tuples of strings": [{{("a", "b"), ("c", str(i)), ("d", "e")}} for i in range(6)],
}}

if __name__ == "__main__":
    r = dsconvert.optimize(fn, INPUTS[sys.argv[2]], sys.argv[1], workers=1, samples_per_shard=2)
    print(r.already_complete, r.shards_resumed, r.shards_written)
"""

UNORDERED_KINDS = ["sets", "frozensets in tuples", "dicts of sets", "objects holding sets", "set subclasses",
                   "sets of tuples of strings"]


@pytest.mark.slow
@pytest.mark.parametrize("kind", UNORDERED_KINDS)
def test_optimize_recognises_its_inputs_under_any_hash_seed(tmp_path, kind):
    job = tmp_path / "job.py"
    job.write_text(FINGERPRINT_JOB.format(tests=HERE))
    out = str(tmp_path / "out")

    def run(seed):
        env = dict(os.environ, PYTHONHASHSEED=str(seed),
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        done = subprocess.run([sys.executable, str(job), out, kind], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    first = run(1)
    shards = int(first[2])
    assert first == ["False", "0", str(shards)] and shards > 1
    assert run(2) == ["True", "0", "0"]  # the finished output, recognised
    os.remove(os.path.join(out, MANIFEST_NAME))  # as if killed before the manifest
    assert run(3) == ["False", str(shards), "0"]  # every shard kept


def test_an_input_with_no_stable_identity_is_refused_in_one_line(tmp_path):
    class Local:  # does not pickle (a local class), and its repr names an address
        pass

    with pytest.raises(OptionError, match="input 1 .*memory address") as err:
        optimize(text_sample, [0, Local()], str(tmp_path / "out"), workers=1)
    assert "\n" not in str(err.value)
