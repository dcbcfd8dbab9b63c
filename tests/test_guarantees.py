"""Issue 33's promises, each tried for its whole class: files dsconvert did not write are never
removed or replaced (whatever a kill left and whatever the user's files are named), the saved
index of a foreign tar is checked at every read after open, and smaller ones (unreadable tars,
non-regular files beside Parquet, reading states of another dataset or past the epoch)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from dsconvert import OutputExistsError, convert
from dsconvert.cli import main
from dsconvert.manifest import MANIFEST_NAME

from conftest import ROOT, make_image_folder, write

# --- 1. a file dsconvert did not write is never removed or replaced ---------------------------

def _kill_leftovers(out: str, fmt: str, shards_left: int) -> None:
    """What a kill before the manifest leaves: the lock and owner files, the first
    ``shards_left`` shards whole, the next one moved into place without its record."""
    os.remove(os.path.join(out, MANIFEST_NAME))
    for name in sorted(os.listdir(out)):
        if not name.startswith("shard-"):
            continue
        index = int(name[6:12])
        if index > shards_left or (index == shards_left and not name.endswith((".tar", ".npy"))) \
                or (index == shards_left and name.endswith(".samples.npy")):
            os.remove(os.path.join(out, name))


UNPLANNED = ["shard-000099.tar", "shard-000500.idx", "shard-000500.index.json", "shard-000007.samples.npy",
             "shard-000042.h5"]


@pytest.mark.parametrize("fmt", ["wds", "npy"])
@pytest.mark.parametrize("shards_left", [0, 2, 4])
def test_files_named_like_shards_that_a_killed_run_did_not_write_stay(tmp_path, image_folder, fmt, shards_left):
    """Unplanned names are left alone and the rerun finishes; a planned name the user's file
    holds (the shard's size or not, a record's name) stops the rerun in one line naming it."""
    out = str(tmp_path / "out")
    convert(image_folder, out, fmt, samples_per_shard=4, workers=1)  # shards 0..3
    _kill_leftovers(out, fmt, shards_left)
    for name in UNPLANNED:
        write(os.path.join(out, name), b"the user's own " + name.encode())
    m = convert(image_folder, out, fmt, samples_per_shard=4, workers=1).manifest
    assert m.num_samples == 16
    for name in UNPLANNED:
        assert open(os.path.join(out, name), "rb").read() == b"the user's own " + name.encode()
    # killed again, then a plan with other shards: the old ones are provably ours and go; the user's stay
    os.remove(os.path.join(out, MANIFEST_NAME))
    m = convert(image_folder, out, fmt, samples_per_shard=8, workers=1).manifest
    shards = sorted(n for n in os.listdir(out) if n.startswith("shard-") and n.endswith((".tar", ".npy"))
                    and not n.endswith(".samples.npy") and n not in UNPLANNED)
    assert shards == [s.name for s in m.shards] and len(shards) == 2
    for name in UNPLANNED:
        assert open(os.path.join(out, name), "rb").read() == b"the user's own " + name.encode()


def _planned_collisions(fmt):
    suffix = ".tar" if fmt == "wds" else ".npy"
    names = [f"shard-000002{suffix}", "shard-000002.idx"]
    return names + (["shard-000002.samples.npy"] if fmt == "npy" else [])


@pytest.mark.parametrize("fmt", ["wds", "npy"])
@pytest.mark.parametrize("same_size", [False, True])
def test_a_users_file_where_a_planned_shard_goes_is_never_replaced(tmp_path, image_folder, fmt, same_size, capsys):
    for k, name in enumerate(_planned_collisions(fmt)):
        out = str(tmp_path / f"out{k}")
        convert(image_folder, out, fmt, samples_per_shard=4, workers=1)
        size = os.path.getsize(os.path.join(out, name))
        _kill_leftovers(out, fmt, 2)  # shard 2 moved into place, its record not yet written
        for n in _planned_collisions(fmt):
            if os.path.exists(os.path.join(out, n)):
                os.remove(os.path.join(out, n))
        data = b"u" * size if same_size else b"the user's own file"
        write(os.path.join(out, name), data)
        with pytest.raises(OutputExistsError, match=f"{name} is not a file this conversion wrote.*move it away"):
            convert(image_folder, out, fmt, samples_per_shard=4, workers=1)
        assert main(["shard", image_folder, "-o", out, "--format", fmt, "--samples-per-shard", "4", "-q"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and name in err[0], err
        assert open(os.path.join(out, name), "rb").read() == data
        os.remove(os.path.join(out, name))  # moved away: the same command finishes
        assert convert(image_folder, out, fmt, samples_per_shard=4, workers=1).manifest.num_samples == 16


def test_an_output_of_a_version_without_the_owner_file_still_resumes_and_cleans_up(tmp_path, image_folder):
    """Outputs finished before the owner file existed: the files their manifest lists are
    theirs, so a rerun after a changed input removes its stale shards as before."""
    out = str(tmp_path / "out")
    convert(image_folder, out, samples_per_shard=4, workers=1)
    os.remove(os.path.join(out, ".dsconvert.owner"))  # as that version left it
    assert convert(image_folder, out, samples_per_shard=4, workers=1).already_complete
    os.remove(os.path.join(out, ".dsconvert.owner"))
    m = convert(image_folder, out, samples_per_shard=8, workers=1, overwrite=True).manifest
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == [s.name for s in m.shards]


@pytest.mark.parametrize("shards_done", [0, 3])
def test_sigkill_then_users_files_then_rerun(tmp_path, photos, shards_done):
    """The issue's case with a real SIGKILL, early (before any shard, so no manifest) or later."""
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 30, "b": 30}, size=(160, 120))
    out = str(tmp_path / "out")
    cmd = [sys.executable, "-m", "dsconvert", "shard", src, "-o", out, "--samples-per-shard", "2", "--workers", "1",
           "-q"]
    proc = subprocess.Popen(cmd, cwd=ROOT, start_new_session=True)
    try:
        while proc.poll() is None:
            listed = os.listdir(out) if os.path.isdir(out) else []
            if ".dsconvert.lock" in listed and sum(n.endswith(".idx") for n in listed) >= shards_done:
                break
            time.sleep(0.001)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    if os.path.exists(os.path.join(out, MANIFEST_NAME)):
        pytest.skip("the conversion finished before the kill")
    for name in ("shard-000099.tar", "shard-000500.idx", "shard-000500.index.json"):
        write(os.path.join(out, name), b"precious")
    assert main(["shard", src, "-o", out, "--samples-per-shard", "2", "--workers", "1", "-q"]) == 0
    for name in ("shard-000099.tar", "shard-000500.idx", "shard-000500.index.json"):
        assert open(os.path.join(out, name), "rb").read() == b"precious"


@pytest.mark.system
def test_a_remote_output_removes_only_what_it_wrote(s3, image_folder):
    """On an object store (no append, no lock) the proofs are objects of their own: a rerun
    after a kill removes its stale shards and keeps the user's, and refuses to replace one."""
    url = s3.url("out")
    convert(image_folder, url, samples_per_shard=4, workers=2, storage_options=s3.options)
    s3.fs.rm_file(f"{s3.bucket}/out/{MANIFEST_NAME}")  # killed before the manifest
    s3.fs.pipe(f"{s3.bucket}/out/shard-000099.tar", b"precious")
    s3.fs.pipe(f"{s3.bucket}/out/shard-000500.index.json", b"precious")
    m = convert(image_folder, url, samples_per_shard=8, workers=2, storage_options=s3.options).manifest
    files = s3.files("out")
    assert files["shard-000099.tar"] == files["shard-000500.index.json"] == b"precious"
    assert sorted(n for n in files if n.endswith(".tar")) == [s.name for s in m.shards] + ["shard-000099.tar"]
    s3.fs.rm_file(f"{s3.bucket}/out/{MANIFEST_NAME}")
    s3.fs.rm_file(f"{s3.bucket}/out/shard-000001.idx")
    s3.fs.pipe(f"{s3.bucket}/out/shard-000001.tar", b"the user's")
    s3.fs.invalidate_cache()
    with pytest.raises(OutputExistsError, match="shard-000001.tar is not a file this conversion wrote"):
        convert(image_folder, url, samples_per_shard=8, workers=2, storage_options=s3.options)
    assert s3.files("out")["shard-000001.tar"] == b"the user's"
