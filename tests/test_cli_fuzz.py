"""Property: whatever argv a user types, the CLI answers with an exit status (0-4), never a
traceback, and writes nowhere but where it was told (here: inside a temporary folder).

argv is built from the real parser (``build_parser()``): its subcommands, options, choices
and positionals, with values that are valid, nearly valid, or hostile (sizes, numbers, paths
that exist or not, files where folders belong, names with undecodable bytes). ``diagnose``
(it starts processes) and ``bench`` (slow) get only arguments that argparse refuses; remote
storage is only fsspec's in-memory file system, so nothing waits on a network.
"""

import argparse
import os
import shutil

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import dsconvert.analyze as analyze_module
from dsconvert.cli import build_parser, main

from conftest import ROOT, encode, examples, make_image_folder, write

EXIT_STATUSES = {0, 1, 2, 3, 4}
UNDECODABLE = os.fsdecode(b"caf\xe9")

PATHS = ["src", "out", "plain.txt", "list.csv", "src/a", "nowhere", "new/deeper", "plain.txt/below", ".",
         "", UNDECODABLE, f"{UNDECODABLE}/out", "out/dsconvert.json", "memory://fuzz/out"]
SIZES = ["0", "-5", "abc", "1.5.5GB", "", "1e3", "12XB"]
INTS = ["0", "-1", "abc", "1.5", "", "99999999999999999999", "\u0663"]
FLOATS = ["0", "-1", "nan", "inf", "abc", ""]
TEXT = st.one_of(st.text(max_size=12), st.binary(max_size=6).map(os.fsdecode))


@st.composite
def mostly(draw, valid, invalid):
    """Three draws in four from ``valid``: a run that gets past argparse tests the library."""
    return draw(valid) if draw(st.integers(0, 3)) else draw(invalid)


def paths(*usual):
    return mostly(st.sampled_from(usual), st.sampled_from(PATHS))


def ints(low, high):
    return mostly(st.integers(low, high).map(str), st.sampled_from(INTS))


# per option (by dest): values that keep a run small (no 100000-pixel resize, no thousand workers)
VALUES = {
    "src": paths("src", "src", "src/a", "list.csv"), "output": paths("new/out", "out2", "out"), "path": paths("out"),
    "url": paths("out"), "cache_dir": paths("cache", "new/cache"), "source": paths("src", "src/a"),
    "output_dir": paths(".", "new"), "report": paths("r.html", "new/r.html", "src"),
    "shard_size": mostly(st.sampled_from(["100", "4kB", "1GB", "512MiB", "1.5kb", "9" * 30 + "TB"]),
                         st.one_of(st.sampled_from(SIZES), TEXT)),
    "max_size": mostly(st.sampled_from(["1", "4kB", "1GB"]), st.one_of(st.sampled_from(SIZES), TEXT)),
    "samples_per_shard": ints(1, 6), "workers": ints(1, 3), "max_image_pixels": ints(1, 10**9),
    "resize": ints(1, 64), "sample": ints(1, 12), "seed": ints(-10**30, 10**30),
    "size": mostly(st.tuples(st.integers(1, 48), st.integers(1, 48)).map(lambda t: f"{t[0]}x{t[1]}"),
                   st.sampled_from(["0x5", "5x", "x", "abc", "-3x4", "8X8", ""])),
    "target": mostly(st.floats(0.1, 1e6).map(str), st.sampled_from(FLOATS)),
    "time_budget": mostly(st.floats(0.1, 5).map(str), st.sampled_from(FLOATS)),
    "prefix": mostly(st.sampled_from(["shard", "part.v1", "p_2"]),
                     st.one_of(st.sampled_from(["../x", "a/b", ""]), TEXT)),
    "storage_option": mostly(st.sampled_from(["anon=true", "a.b=1", "a=1"]),
                             st.one_of(st.sampled_from(["x", "=1"]), TEXT)),
    "cluster": st.sampled_from(["nonsense", "local:0", "local:x", ""]),  # never a real cluster
}
# diagnose and bench: only what argparse refuses (exit 2), so nothing is launched or timed
REFUSED = {
    "diagnose": [["--pid", "0"], ["--pid", "abc"], ["--rate", "-1"], ["--duration", "x"], ["--bogus"],
                 ["--pid", "1", "--tracer", "ltrace"]],
    "bench": [[], ["p", "--workers", "-1"], ["p", "--batch-size", "0"], ["p", "--max-samples", "0"],
              ["p", "--decode", "gif"], ["p", "--cache", "hot"], ["p", "--size", "x"], ["p", "--bogus"]],
}


def _subcommands():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _value(action):
    if action.dest in VALUES:
        return VALUES[action.dest]
    if action.choices:
        return mostly(st.sampled_from(list(action.choices)), TEXT)
    return TEXT


@st.composite
def argvs(draw):
    """A command line of the real parser: a subcommand, its positionals and some options."""
    commands = _subcommands()
    name = draw(st.sampled_from(sorted(commands)))
    if name in REFUSED:
        return [name] + draw(st.sampled_from(REFUSED[name]))
    argv = [name]
    for action in commands[name]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if not action.option_strings:  # a positional: usually given, sometimes not
            if draw(st.integers(0, 19)):
                argv.append(draw(_value(action)))
            continue
        if action.required or draw(st.integers(0, 3)) == 0:
            flag = draw(st.sampled_from(action.option_strings))
            if action.nargs == 0:
                argv.append(flag)
            else:
                argv += [flag, draw(_value(action))]
    if draw(st.integers(0, 19)) == 0:  # and now and then something argparse does not know
        argv.insert(draw(st.integers(1, len(argv))), draw(st.sampled_from(["--bogus", "-z", "--", "extra"])))
    return argv


@pytest.fixture(scope="module")
def world(tmp_path_factory, photos):
    """What a user's folder holds: a source, a finished output of it, a list file, a file."""
    root = tmp_path_factory.mktemp("world")
    src = str(root / "src")
    make_image_folder(src, photos, {"a": 3, "b": 2}, size=(48, 36))
    write(str(root / "src" / "b" / "notes.txt"), b"not an image")
    write(str(root / "plain.txt"), b"just text\n")
    write(str(root / "list.csv"), b"path,label\nsrc/a/a_0000.jpg,cat\nsrc/b/b_0000.jpg,dog\nsrc/b/nope.jpg,dog\n")
    undecodable = os.path.join(str(root), UNDECODABLE)
    write(os.path.join(undecodable, "c", "x.jpg"), encode(photos["rocket"].resize((32, 24))))
    assert main(["shard", src, "-o", str(root / "out"), "--samples-per-shard", "2", "--workers", "1", "-q"]) == 3
    return str(root)


def _top_level(path):
    try:
        return set(os.listdir(path))
    except OSError:
        return set()


real_analyze = analyze_module.analyze


def quick_analyze(*args, **kwargs):
    """analyze for real, with one worker and short passes: its exit statuses are tested here,
    not its figures (a full run per draw made this test take minutes)."""
    kwargs.update(pass_seconds=0.05, sweep_levels=[1], workers=kwargs.get("workers") or 1)
    return real_analyze(*args, **kwargs)

WATCHED = [ROOT, os.path.join(ROOT, "tests"), os.path.expanduser("~")]
NAMES = {p.split("/")[0] for p in PATHS if p and "://" not in p} | {"r.html", "out2", "cache"}


@pytest.mark.slow
@settings(max_examples=examples(150), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(argv=argvs())
def test_any_argv_gives_an_exit_status_and_no_traceback(world, tmp_path, monkeypatch, capsys, argv):
    here = tmp_path / "run"
    shutil.rmtree(here, ignore_errors=True)
    shutil.copytree(world, here, symlinks=True)
    monkeypatch.chdir(here)
    monkeypatch.setattr(analyze_module, "analyze", quick_analyze)
    before = {p: _top_level(p) for p in WATCHED}
    code = main(argv)
    out, err = capsys.readouterr()
    assert isinstance(code, int) and code in EXIT_STATUSES, (argv, code, err)
    for text in (out, err):
        assert "Traceback" not in text and "internal error" not in text, (argv, text)
    if code == 1:  # a library error is one line
        lines = [line for line in err.splitlines() if line.startswith("dsconvert: error:")]
        assert len(lines) == 1, (argv, err)
    for p, names in before.items():  # nothing appeared outside the temporary folder
        assert not (_top_level(p) - names) & NAMES, (argv, p, _top_level(p) - names)
