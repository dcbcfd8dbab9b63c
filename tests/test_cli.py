import subprocess
import sys

import pytest

from dsconvert.cli import build_parser, main


def test_help_explains_every_option(capsys):
    parser = build_parser()
    shard = parser._subparsers._group_actions[0].choices["shard"]
    for action in shard._actions:
        if action.dest != "help":
            assert action.help, f"--{action.dest} has no help"
    assert main(["shard", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--format", "--layout", "--samples-per-shard", "--shard-size", "--workers",
                 "--no-verify", "--strict", "--overwrite", "-q"):
        assert flag in text


def test_usage_errors_exit_2(capsys):
    assert main(["shard", "src"]) == 2  # no -o
    assert main(["shard", "src", "-o", "x", "--workers", "0"]) == 2
    assert "must be >= 1" in capsys.readouterr().err


def test_missing_source_is_one_line(tmp_path, capsys):
    assert main(["shard", str(tmp_path / "nope"), "-o", str(tmp_path / "out"), "-q"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("dsconvert: error: source does not exist")


def test_python_m_and_quiet(tmp_path, image_folder):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, "-m", "dsconvert", "shard", image_folder, "-o", str(out), "-q"],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout == "" and run.stderr == ""
    info = subprocess.run([sys.executable, "-m", "dsconvert", "info", str(out)], capture_output=True, text=True)
    assert "samples:     16 (classification, encoded)" in info.stdout


def test_conversion_never_imports_torch(tmp_path, image_folder):
    code = ("import sys, dsconvert; dsconvert.convert(sys.argv[1], sys.argv[2], workers=2); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code, image_folder, str(tmp_path / "out")], check=True)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["wds", "hdf5", "npy"])
def test_reading_local_shards_never_imports_fsspec(tmp_path, image_folder, fmt):
    """fsspec's ~13,000 objects in a training process slow every DataLoader worker's start
    (the forked child's garbage collector copies their pages): local reads must not load it."""
    out = str(tmp_path / "out")
    subprocess.run([sys.executable, "-m", "dsconvert", "shard", image_folder, "-o", out, "--format", fmt, "-q"],
                   check=True)
    code = ("import sys, dsconvert; ds = dsconvert.open_dataset(sys.argv[1]); "
            "next(iter(ds)) if sys.argv[2] == 'wds' else ds[0]; "
            "assert 'fsspec' not in sys.modules, 'fsspec imported'")
    subprocess.run([sys.executable, "-c", code, out, fmt], check=True)
