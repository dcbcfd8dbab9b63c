"""The CLI's promise, input by input (issue 13): a library error is one line on stderr,
``dsconvert: error: ...``, and exit status 1; a usage error is argparse's, exit status 2; no
traceback ever reaches the user, and no message prints ``None``."""

import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from PIL import Image

from dsconvert.cli import main
from dsconvert.formats.columns import MAGIC

from conftest import ROOT, encode, make_image_folder, write
from support.records import record_path

DSCONVERT = os.path.join(os.path.dirname(sys.executable), "dsconvert")


def cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``dsconvert ARGV``, run in this process."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_error(code, err, *words):
    """Exit status 1 and exactly one line on stderr, the library's error, holding ``words``."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and lines[0].startswith("dsconvert: error: "), (code, err)
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert "None" not in lines[0], lines[0]
    return lines[0]


def assert_usage(code, err, *words, what="argument"):
    """A usage error: exit status 2 and two lines, the error (``dsconvert CMD: error: argument
    ...``) and where the options are (``dsconvert CMD --help``): not the usage first."""
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2, (code, err)
    first, hint = lines
    assert first.startswith("dsconvert") and f": error: {what}" in first, first
    command = first.split(": error:")[0]
    assert hint == f"see `{command} --help` for the options", hint
    for word in words:
        assert word in first, (word, first)
    return first


@pytest.fixture
def small_src(tmp_path, photos):
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"cat": 3, "dog": 3})
    return root


@pytest.fixture
def out(tmp_path, small_src, capsys):
    """A finished wds output of ``small_src``."""
    folder = str(tmp_path / "out")
    assert cli(capsys, "shard", small_src, "-o", folder, "--samples-per-shard", "2", "--workers", "1", "-q")[0] == 0
    return folder


def fsname(path: str, raw: bytes) -> str:
    """``path`` joined with a file name made of raw (non-UTF-8) bytes."""
    return os.path.join(path, os.fsdecode(raw))


# --- names that are not UTF-8 -------------------------------------------------------------------


def test_non_utf8_extension_is_a_counted_skip(tmp_path, photos, capsys):
    src = str(tmp_path / "flat")
    jpeg = encode(photos["camera"].resize((32, 24)))
    write(os.path.join(src, "a.jpg"), jpeg)
    write(fsname(src, b"x.jp\xe9g"), jpeg)
    folder = str(tmp_path / "out")
    for _ in range(2):  # the rerun of a finished output as well
        code, _, err = cli(capsys, "shard", src, "-o", folder, "--layout", "flat", "--workers", "1", "-q")
        assert code == 3 and "Traceback" not in err, err
    raw = open(os.path.join(folder, "dsconvert.json"), "rb").read()
    manifest = json.loads(raw.decode("utf-8"))  # strict UTF-8 JSON
    assert manifest["accounting"]["files_skipped"] == 1
    assert manifest["skipped"] == [{"path": "x.jp%E9g", "reason": manifest["skipped"][0]["reason"]}]
    assert "not printable UTF-8" in manifest["skipped"][0]["reason"]


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "npy"])
def test_non_utf8_source_root_is_refused_with_its_reason(tmp_path, photos, capsys, fmt):
    root = fsname(str(tmp_path), b"caf\xe9")
    make_image_folder(root, photos, {"a": 2, "b": 2})
    for _ in range(2):  # every rerun says the same, no traceback
        code, _, err = cli(capsys, "shard", root, "-o", tmp_path / f"out-{fmt}", "--format", fmt, "--workers", "1",
                           "-q")
        assert_error(code, err, "caf%E9", "not valid UTF-8", "symlink")


def test_non_utf8_class_and_file_names_convert_and_print(tmp_path, photos, capsys):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"dog": 2})
    write(os.path.join(fsname(src, b"caf\xe9"), os.fsdecode(b"na\xefve.jpg")),
          encode(photos["coffee"].resize((40, 30))))
    write(os.path.join(src, "dog", os.fsdecode(b"x.jp\xe9g")), b"not an image")
    folder = str(tmp_path / "out")
    code, _, err = cli(capsys, "shard", src, "-o", folder, "--workers", "1", "-q")
    assert code == 3 and "Traceback" not in err
    json.loads(open(os.path.join(folder, "dsconvert.json"), "rb").read().decode("utf-8"))
    code, text, err = cli(capsys, "info", "--skipped", folder)  # pytest's stdout is strict UTF-8
    assert code == 0 and err == "" and "caf\\udce9" in text and "x.jp%E9g" in text


# --- sizes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["abc", "-5", "1.5.5GB", "0", "0.1", "", "12XB"])
def test_bad_shard_size_is_a_usage_error(tmp_path, small_src, capsys, value):
    code, _, err = cli(capsys, "shard", small_src, "-o", tmp_path / "out", "--shard-size", value, "-q")
    assert_usage(code, err, "--shard-size")
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("value", ["abc", "0", "-1GB"])
def test_bad_cache_max_size_is_a_usage_error(tmp_path, out, capsys, value):
    code, _, err = cli(capsys, "cache", out, tmp_path / "cache", "--max-size", value)
    assert_usage(code, err, "--max-size")


def test_huge_shard_size_is_exact(tmp_path, small_src, capsys):
    code, _, err = cli(capsys, "shard", small_src, "-o", tmp_path / "out", "--shard-size", "9" * 400 + "TB",
                       "--workers", "1", "-q")
    assert code == 0, err


# --- usage errors: the error and one hint; no abbreviations (issue 40, item 17) ----------------


def commands():
    """(name, parser) of the top parser and of every subcommand, found through argparse itself."""
    import argparse

    from dsconvert.cli import build_parser

    top = build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [("", top)] + sorted(subs.choices.items())


def required_args(parser):
    """A command line the parser takes: each required argument given a value."""
    argv = []
    for a in parser._actions:
        if a.required and a.dest != "command":
            argv += ([a.option_strings[0]] if a.option_strings else []) + ["x"]
    return argv


def accepted_value(action):
    """A value ``action`` takes, or None for a flag."""
    if action.nargs == 0:
        return None
    if action.choices:
        return str(next(iter(action.choices)))
    for value in ("1", "1x1", "zstd", "x"):
        try:
            (action.type or str)(value)
            return value
        except Exception:
            continue
    raise AssertionError(f"no value found for {action.option_strings}")


def rejected_value(action):
    """A value ``action`` refuses, or None when it takes anything."""
    for value in ("abc", "-1", "0", "", "1.5"):
        if action.choices and value not in [str(c) for c in action.choices]:
            return value
        try:
            if action.type is not None:
                action.type(value)
        except Exception:
            return value
    return None


def test_every_abbreviated_option_is_refused_not_taken(capsys):
    """``--worker 2`` was ``--workers 2``: every long option of every command, cut short by one
    letter (where that names no other option), is refused as unknown and names the option meant."""
    tried = 0
    for name, parser in commands():
        longs = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
        for action in parser._actions:
            for option in (s for s in action.option_strings if s.startswith("--")):
                short = option[:-1]
                if sum(o.startswith(short) for o in longs) != 1:
                    continue  # ambiguous: argparse refuses it either way
                value = accepted_value(action)
                given = [short] + ([value] if value else [])
                argv = [name, *required_args(parser), *given] if name else [*given, "info", "x"]
                with pytest.raises(SystemExit) as caught:
                    commands()[0][1].parse_args(argv)
                first = assert_usage(caught.value.code, capsys.readouterr().err, what="unrecognized arguments")
                assert f"unrecognized arguments: {short}" in first and f"did you mean {option}?" in first, first
                tried += 1
    assert tried >= 60, tried


def test_every_bad_value_is_two_lines(capsys):
    """Every option of every command that refuses a value says so in two lines: the error, then
    ``see `dsconvert CMD --help` ...``; so do a missing argument, an unknown command and option."""
    tried = 0
    for name, parser in commands():
        for action in parser._actions:
            if not action.option_strings or action.nargs == 0:
                continue
            value = rejected_value(action)
            if value is None:
                continue
            argv = ([name] if name else []) + required_args(parser) + [action.option_strings[-1], value]
            code, _, err = cli(capsys, *argv)
            assert_usage(code, err, action.option_strings[-1])
            tried += 1
        if name:
            code, _, err = cli(capsys, name, *required_args(parser), "--no-such-option")
            assert_usage(code, err, "--no-such-option", what="unrecognized arguments")
            if required_args(parser):
                code, _, err = cli(capsys, name)
                assert_usage(code, err, what="the following arguments are required")
    assert tried >= 25, tried
    code, _, err = cli(capsys, "shrad")
    assert_usage(code, err, "invalid choice: 'shrad'")
    code, _, err = cli(capsys, "shard", "src", "-o", "out", "--format", "parquet")  # the first hour's two
    assert_usage(code, err, "--format", "invalid choice: 'parquet'")
    code, _, err = cli(capsys, "shard", "src", "-o", "out", "--resize", "abc")
    assert_usage(code, err, "--resize", "'abc'")


# --- paths that are not what the command needs -------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["shard", "{src}", "-o", "{file}"], ["the output", "is a file"]),
    (["shard", "{src}", "-o", "{file}/sub"], ["is inside", "which is a file"]),
    (["verify", "{file}"], ["is a file, not a dsconvert output folder"]),
    (["info", "{file}"], ["is a file, not a dsconvert output folder"]),
    (["cache", "{file}", "{tmp}/cache"], ["is a file, not a dsconvert output folder"]),
    (["cache", "{out}", "{file}"], ["the cache folder", "is a file"]),
    (["verify", "{tmp}/nowhere"], ["does not exist"]),
    (["info", "{tmp}/nowhere"], ["does not exist"]),
    (["shard", "{tmp}/nowhere", "-o", "{tmp}/o", "-q"], ["does not exist"]),
    (["analyze", "{tmp}/nowhere"], ["does not exist"]),
])
def test_wrong_kind_of_path_is_one_line(tmp_path, small_src, out, capsys, argv, words):
    file = tmp_path / "plain.txt"
    file.write_text("not a folder\n")
    args = [a.format(src=small_src, file=file, out=out, tmp=tmp_path) for a in argv]
    code, _, err = cli(capsys, *args)
    line = assert_error(code, err, *words)
    assert str(tmp_path) in line  # names the path


def _as_nobody():
    """argv prefix that runs a command as an unprivileged user (root reads everything)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("setpriv"):
        pytest.skip("running as root without setpriv: cannot drop privileges to test permissions")
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def shared_tmp():
    """A folder an unprivileged user can reach (pytest's tmp_path is private to its owner)."""
    path = tempfile.mkdtemp(prefix="dsconvert-perm-")
    os.chmod(path, 0o755)
    yield path
    for dirpath, dirnames, _ in os.walk(path):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o755)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("argv, words", [
    (["info", "{locked}"], ["permission denied", "{locked}"]),
    (["verify", "{locked}"], ["permission denied", "{locked}"]),
    (["shard", "{locked}", "-o", "{shared}/open/out"], ["cannot read the source folder", "permission denied"]),
    (["shard", "{src}", "-o", "{locked}/out"], ["permission denied", "{locked}/out"]),
])
def test_folder_without_permission_is_one_line(shared_tmp, photos, argv, words):
    src = os.path.join(shared_tmp, "src")
    make_image_folder(src, photos, {"a": 2, "b": 2})
    locked = os.path.join(shared_tmp, "locked")
    shutil.copytree(src, locked)
    for dirpath, dirnames, filenames in os.walk(shared_tmp):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o755)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    os.chmod(locked, 0o700 if os.geteuid() == 0 else 0o000)
    os.makedirs(os.path.join(shared_tmp, "open"), mode=0o777)
    os.chmod(os.path.join(shared_tmp, "open"), 0o777)
    fill = dict(locked=locked, shared=shared_tmp, src=src)
    cmd = _as_nobody() + [DSCONVERT] + [a.format(**fill) for a in argv] + ["-q"] * (argv[0] == "shard")
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=shared_tmp, env=dict(os.environ, HOME=shared_tmp))
    line = assert_error(run.returncode, run.stderr, *[w.format(**fill) for w in words])
    assert "credentials" not in line  # a local folder is not a storage client's problem


# --- broken pipes -----------------------------------------------------------------------------------


@pytest.fixture
def many_skipped(tmp_path, photos, capsys):
    """An output whose `info --skipped` is larger than a pipe's buffer (64 kB)."""
    src = str(tmp_path / "many")
    write(os.path.join(src, "a", "one.jpg"), encode(photos["rocket"].resize((32, 24))))
    for i in range(3000):
        write(os.path.join(src, "a", f"note_{i:05d}.txt"), b"x")
    folder = str(tmp_path / "many-out")
    assert cli(capsys, "shard", src, "-o", folder, "--workers", "1", "-q")[0] == 3
    return folder


@pytest.mark.slow
def test_broken_pipe_is_quiet(many_skipped):
    run = subprocess.run(f"'{DSCONVERT}' info --skipped '{many_skipped}' | head -1; exit ${{PIPESTATUS[0]}}",
                         shell=True, executable="/bin/bash", capture_output=True, text=True)
    assert run.stdout.startswith("format:")
    assert run.stderr == "", run.stderr
    assert run.returncode in (0, 141)


@pytest.mark.parametrize("argv", [
    ["info", "--skipped", "{out}"], ["verify", "{out}"], ["verify", "--json", "-q", "{out}"],
    ["shard", "{src}", "-o", "{tmp}/again", "--workers", "1"],
    pytest.param(["analyze", "--json", "-q", "--sample", "4", "{src}"], marks=pytest.mark.slow),
    ["cache", "--json", "-q", "{out}", "{tmp}/cache"], ["--help"], ["shard", "--help"], ["--version"],
])
def test_every_command_handles_a_closed_stdout(tmp_path, small_src, out, capsys, monkeypatch, argv):
    """Each command printing into a pipe whose reader has gone: quiet, as `cat` would be (argparse
    itself drops --help's text silently; the commands exit 141), no error on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    closed = io.TextIOWrapper(io.FileIO(write_end, "w"), encoding="utf-8", write_through=True)
    monkeypatch.setattr(sys, "stdout", closed)
    code = main([a.format(out=out, src=small_src, tmp=tmp_path) for a in argv])
    monkeypatch.undo()
    assert code == (0 if "--help" in argv or "--version" in argv else 141)
    err = capsys.readouterr().err  # progress lines may be there
    assert "Traceback" not in err and "error" not in err, err


# --- manifests and shard records of the wrong shape ------------------------------------------------


def _edit_manifest(folder, change):
    path = os.path.join(folder, "dsconvert.json")
    with open(path) as f:
        d = json.load(f)
    change(d)
    with open(path, "w") as f:
        json.dump(d, f)


@pytest.mark.parametrize("field, change", [
    ("options", lambda d: d.update(options=[])),
    ("options.prefix", lambda d: d["options"].update(prefix=["shard"])),
    ("accounting", lambda d: d.update(accounting="lots")),
    ("skipped", lambda d: d.update(skipped=[{"path": "a.jpg", "reason": 5}])),
    ("source.url", lambda d: d.update(source={"url": 5})),
    ("source.layout", lambda d: d["source"].update(layout="sideways")),
    ("created_by", lambda d: d.update(created_by=3)),
    ("fields", lambda d: d.update(fields={"jpg": 5})),
    ("schema_version", lambda d: d.update(schema_version=True)),
])
@pytest.mark.parametrize("command", ["info", "verify"])
def test_manifest_field_of_the_wrong_type_is_named(out, capsys, field, change, command):
    _edit_manifest(out, change)
    code, _, err = cli(capsys, command, out)
    assert_error(code, err, f"field '{field}'", "dsconvert.json")


@pytest.mark.parametrize("command", ["info", "verify"])
def test_deeply_nested_manifest_is_a_manifest_error(out, capsys, command):
    with open(os.path.join(out, "dsconvert.json"), "w") as f:
        f.write("[" * 100000)
    code, _, err = cli(capsys, command, out)
    assert_error(code, err, "dsconvert.json", "nested too deeply")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary-header"])
def test_deeply_nested_shard_record_is_a_problem_not_a_crash(out, capsys, binary):
    nested = b"[" * 100000  # an older output's JSON record, or the JSON header of a binary one
    with open(record_path(out, "shard-000000.tar"), "wb") as f:
        f.write(MAGIC + len(nested).to_bytes(8, "little") + nested if binary else nested)
    code, text, err = cli(capsys, "verify", out)
    assert code == 4 and "Traceback" not in err and "shard-000000" in text, (code, text, err)


def test_no_message_prints_none(out, capsys):
    def strip(d):
        for key in ("accounting", "created_by", "options"):
            d.pop(key)
        d["source"] = {}
    _edit_manifest(out, strip)
    code, text, err = cli(capsys, "info", "--skipped", out)
    assert code == 0 and err == ""
    assert "None" not in text and "inputs:      not recorded" in text


# --- list sources ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name, data, words", [
    ("big.csv", b"img.jpg,100000000000000000000000\n", ["big.csv:1", "out of range", "int64"]),
    ("big.jsonl", b'{"path": "img.jpg", "label": 100000000000000000000000}\n', ["big.jsonl:1", "out of range"]),
    ("neg.csv", b"path,label\nimg.jpg,0\nimg.jpg,-3\n", ["neg.csv:3", "label -3 is out of range"]),
    ("neg.jsonl", b'{"path": "img.jpg", "label": -1}\n', ["neg.jsonl:1", "label -1"]),
    ("latin1.csv", b"img.jpg,0\ncaf\xe9.jpg,1\n", ["latin1.csv:2", "not UTF-8", "0xE9"]),
    ("latin1.jsonl", b'{"path": "img.jpg", "label": 0}\n{"path": "caf\xe9.jpg", "label": 1}\n',
     ["latin1.jsonl:2", "not UTF-8"]),
    ("null.jsonl", b'{"path": "img.jpg", "label": null}\n', ["null.jsonl:1", "'label' must be"]),
    ("deep.jsonl", b"[" * 100000 + b"\n", ["deep.jsonl:1"]),
])
@pytest.mark.parametrize("fmt", ["wds", "hdf5", "npy"])
def test_bad_list_source_is_one_line(tmp_path, photos, capsys, name, data, words, fmt):
    write(str(tmp_path / "img.jpg"), encode(photos["camera"].resize((32, 24))))
    write(str(tmp_path / name), data)
    code, _, err = cli(capsys, "shard", tmp_path / name, "-o", tmp_path / "out", "--format", fmt, "--workers", "1",
                       "-q")
    assert_error(code, err, *words)


# --- analyze --------------------------------------------------------------------------------------


class _Tripwire:
    """Unpickling this creates a file: proof that a .npy was unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.slow
def test_analyze_never_unpickles_object_npy(tmp_path, photos, capsys):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3})
    marker = str(tmp_path / "unpickled")
    with open(os.path.join(src, "a", "objects.npy"), "wb") as f:
        np.save(f, np.array([_Tripwire(marker), None], dtype=object), allow_pickle=True)
    np.save(os.path.join(src, "a", "fine.npy"), np.zeros((3, 4), np.float32))
    write(os.path.join(src, "a", "broken.npy"), b"\x93NUMPY garbage")
    write(os.path.join(src, "a", "liar.npy"), b"\x93NUMPY\x01\x00v\x00{'descr': '<f8', 'fortran_order': False, "
          b"'shape': (100000000000,), }" + b" " * 50 + b"\n")
    texts = {}
    for argv in (["--json"], []):
        code, texts[bool(argv)], err = cli(capsys, "analyze", src, "-q", "--sample", "20", *argv)
        assert code == 0 and "Traceback" not in err, err
    assert not os.path.exists(marker)
    report = json.loads(texts[True])
    said = report["decode"]["npy_not_loaded"]
    assert "1 of 4 .npy files hold Python objects" in said and "2 of 4 .npy files are not valid" in said
    assert "npy_load_ms" in report["decode"]


# --- --max-image-pixels -----------------------------------------------------------------------


def test_max_image_pixels_raises_the_limit_too(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    src = str(tmp_path / "src")
    write(os.path.join(src, "a", "big.png"), encode(Image.new("RGB", (40, 40), (10, 200, 30)), "PNG"))
    write(os.path.join(src, "a", "small.png"), encode(Image.new("RGB", (20, 20), (10, 200, 30)), "PNG"))
    code, _, err = cli(capsys, "shard", src, "-o", tmp_path / "default", "--workers", "1")
    assert code == 3 and "decompression bomb" in err and "Traceback" not in err
    code, _, err = cli(capsys, "shard", src, "-o", tmp_path / "raised", "--max-image-pixels", "10000", "--workers",
                       "1", "-q")
    assert code == 0, err
    manifest = json.load(open(tmp_path / "raised" / "dsconvert.json"))
    assert manifest["num_samples"] == 2 and manifest["options"]["max_image_pixels"] == 10000


# --- full disks and dead workers ------------------------------------------------------------------


NO_SPACE = ("Can't decrement id ref count (file write failed: time = Thu Jan  1 00:00:00 2026\n, filename = "
            "'.shard-000000.h5.1.tmp', file descriptor = 5, errno = 28, error message = 'No space left on device', "
            "buf = 0x1, total write size = 976, bytes this sub-write = 976, offset = 192512)")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_hdf5_write_error_on_full_disk_is_resumable(tmp_path, small_src, capsys, monkeypatch, workers):
    """h5py reports a failed flush as a RuntimeError with libhdf5's errno text."""
    from dsconvert.formats import hdf5

    def full(self):
        raise RuntimeError(NO_SPACE)

    monkeypatch.setattr(hdf5._HdfSink, "close", full)
    argv = ["shard", small_src, "-o", tmp_path / "out", "--format", "hdf5", "--decode", "--samples-per-shard", "2",
            "--workers", workers, "-q"]
    code, _, err = cli(capsys, *argv)
    assert_error(code, err, "no space left on", "run the same command again to resume")
    monkeypatch.undo()
    assert cli(capsys, *argv)[0] == 0


@pytest.fixture
def tmpfs(tmp_path):
    """A mount point for small tmpfs, where this machine lets us mount one (root with CAP_SYS_ADMIN)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN); the injected test runs")
    subprocess.run(["umount", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


@pytest.mark.slow
@pytest.mark.system
@pytest.mark.parametrize("workers", ["1", "2"])
def test_hdf5_decoded_on_a_real_full_disk(tmp_path, photos, tmpfs, workers):
    """libhdf5 fails a write, a flush or a close, and segfaults freeing a file whose write
    failed: run as the user does, in a process, with the disk filling at several points."""
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 12, "b": 12}, size=(160, 120))
    cmd = [sys.executable, "-m", "dsconvert", "shard", src, "-o", str(tmpfs / "out"), "--format", "hdf5", "--decode",
           "--force", "--samples-per-shard", "3", "--workers", workers, "-q"]
    for size in ("200k", "400k", "600k"):
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(tmpfs)], check=True)
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            assert_error(run.returncode, run.stderr, "no space left on", "run the same command again to resume")
            subprocess.run(["mount", "-o", "remount,size=16m", str(tmpfs)], check=True)
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            assert run.returncode == 0 and run.stderr == "", run.stderr
        finally:
            subprocess.run(["umount", str(tmpfs)], check=True)


def test_dead_worker_is_one_line_and_resumable(tmp_path, small_src, capsys, monkeypatch):
    from dsconvert.formats import wds

    parent = os.getpid()
    real = wds.Wds.write_shard.__func__

    def dying(cls, spec, samples):
        if os.getpid() != parent and spec.index == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer does
        return real(cls, spec, samples)

    monkeypatch.setattr(wds.Wds, "write_shard", classmethod(dying))
    argv = ["shard", small_src, "-o", tmp_path / "out", "--samples-per-shard", "2", "--workers", "2", "-q"]
    code, _, err = cli(capsys, *argv)
    assert_error(code, err, "worker process died", "run the same command again")
    monkeypatch.undo()
    assert cli(capsys, *argv)[0] == 0


# --- an output that is not there, being written, or stopped (issue 40, item 16) ------------------

WRITER_THEN_WAIT = """
import sys, numpy as np, dsconvert
w = dsconvert.Writer(sys.argv[1], samples_per_shard=2).__enter__()
for i in range(3):  # one shard finished (a .tar in place), one open
    w.write({"jpg": np.full((8, 8, 3), i * 40, dtype=np.uint8), "cls": i % 2})
print("writing", flush=True)
sys.stdin.readline()
w.__exit__(None, None, None)
print("done", flush=True)
"""

SHARD_THEN_WAIT = """
import sys
from dsconvert.cli import main
from dsconvert.write import loop
run = loop.run_shards
def paused(*args, **kwargs):  # the conversion holds its lock and has planned its shards: wait here
    print("writing", flush=True)
    sys.stdin.readline()
    return run(*args, **kwargs)
loop.run_shards = paused
sys.exit(main(sys.argv[1:]))
"""


def missing_says(capsys, path):
    """What open_dataset, `dsconvert info` and `dsconvert verify` say of ``path``: one line each."""
    import dsconvert
    from dsconvert.errors import DsconvertError

    said = []
    with pytest.raises(DsconvertError) as caught:
        dsconvert.open_dataset(path)
    said.append(str(caught.value))
    for command in ("info", "verify"):
        code, _, err = cli(capsys, command, path)
        said.append(assert_error(code, err))
    return said


def started(script, *argv):
    """A Python process running ``script`` with ``argv``, once it has said it is writing."""
    proc = subprocess.Popen([sys.executable, "-c", script, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
    return proc


def test_a_path_that_does_not_exist_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("nosuch", str(tmp_path / "nosuch"), str(tmp_path / "nosuch" / "deeper")):
        for line in missing_says(capsys, path):
            assert "does not exist" in line and "nosuch" in line, line
            assert "run the same" not in line and "has not finished" not in line, line
    (tmp_path / "empty").mkdir()
    for line in missing_says(capsys, str(tmp_path / "empty")):
        assert "not a dsconvert output" in line and "run the same" not in line, line


@pytest.mark.parametrize("how", ["writer", "shard"])
def test_an_output_being_written_says_so_then_opens(tmp_path, small_src, capsys, how):
    """A real conversion in another process holds the output's lock: `a conversion is writing it
    now`, never `run it again` (nor its finished shards read as tars in place); once it has
    finished the same calls open it; killed, it says to run it again."""
    import dsconvert

    out = str(tmp_path / "out")
    for finish in (True, False):
        if how == "writer":
            proc = started(WRITER_THEN_WAIT, out)
            assert any(n.endswith(".tar") for n in os.listdir(out))  # a finished shard is there already
        else:
            proc = started(SHARD_THEN_WAIT, "shard", small_src, "-o", out, "--workers", "1", "-q", "--overwrite")
        try:
            for line in missing_says(capsys, out):
                assert "a conversion is writing it now" in line and out in line, line
                assert "run the same" not in line, line
            if finish:
                proc.communicate("\n", timeout=120)
                assert proc.returncode == 0
                assert len(dsconvert.open_dataset(out)) in (3, 6)
                assert cli(capsys, "info", out)[0] == 0
                os.remove(os.path.join(out, "dsconvert.json"))  # as if it never finished
                for line in missing_says(capsys, out):
                    assert "stopped before it finished" in line and "run the same `dsconvert shard`" in line, line
            else:
                proc.kill()
                proc.wait()
                for line in missing_says(capsys, out):
                    assert "stopped before it finished" in line, line
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(out)


def test_a_writer_in_this_process_is_writing_and_keeps_its_lock(tmp_path, capsys):
    """Asking in the process that writes must not drop its lock (closing a second descriptor of
    a file drops the process's record locks): another process still cannot take the output."""
    import dsconvert
    from dsconvert.errors import OutputLockedError

    out = str(tmp_path / "out")
    with dsconvert.Writer(out) as w:
        w.write({"jpg": np.zeros((8, 8, 3), dtype=np.uint8), "cls": 0})
        for line in missing_says(capsys, out):
            assert "a conversion is writing it now" in line, line
        other = subprocess.run([sys.executable, "-c", "import sys, dsconvert\nwith dsconvert.Writer(sys.argv[1]): pass",
                                out], capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=ROOT))
        assert other.returncode != 0 and OutputLockedError.__name__ in other.stderr, other.stderr
    assert len(dsconvert.open_dataset(out)) == 1
