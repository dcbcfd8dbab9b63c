"""Issue 40's write-side promises, each tried for its whole class: one writer per output within
a process too (whatever the spelling of the folder), cleanup removes only what the owner journal
proves ours (temporary files included), control files are never followed through links, bad
values and bad options are one-line errors at the moment they are given, field names are
unique as webdataset reads them, and optimize recognises its own inputs in any process."""

import os
import subprocess
import threading

import pytest

from dsconvert import (
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
