"""A folder of .npy arrays packed into a memory-mapped npy cache (issue 41: the fix diagnose
prints for a job that np.loads one small file a sample, run as printed)."""

import io
import os
import subprocess
import sys

import numpy as np
import pytest

from dsconvert import SourceError, convert, open_dataset
from dsconvert.diagnose import shard_formats
from dsconvert.diagnose.fixes import Fixes, apply_fixes
from dsconvert.formats.npy import open_arrays

torch = pytest.importorskip("torch")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def arrays(root, n=24, shape=(3, 8, 8), dtype=np.float32, classes=None):
    """``n`` real arrays saved with np.save, flat or in ``classes`` folders; key -> array."""
    rng = np.random.default_rng(0)
    saved = {}
    for i in range(n):
        folder = os.path.join(root, f"class{i % classes}") if classes else root
        os.makedirs(folder, exist_ok=True)
        a = (rng.random(shape) * 100).astype(dtype)
        np.save(os.path.join(folder, f"{i:04d}.npy"), a)
        saved[os.path.relpath(os.path.join(folder, f"{i:04d}"), root)] = a
    return saved


def cli(*args):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "dsconvert", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["flat", "class folders"])
def test_a_folder_of_arrays_reads_back_equal_to_np_load_through_workers(tmp_path, layout):
    src = str(tmp_path / "arrays")
    saved = arrays(src, classes=3 if layout == "class folders" else None)
    out = str(tmp_path / "cache")
    run = cli("shard", src, "--format", "npy", "-o", out, "-q", "--samples-per-shard", "10")
    assert run.returncode == 0, run.stderr
    ds = open_dataset(out)
    assert len(ds) == len(saved)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2, shuffle=True)
    seen = {}
    for batch in loader:
        for key, array in zip(batch["__key__"], batch["npy"]):
            seen[key] = array.numpy()
    assert seen.keys() == saved.keys()
    for key, array in saved.items():
        np.testing.assert_array_equal(seen[key], array)
        assert seen[key].dtype == array.dtype
    # the shard is one N-D array, readable without dsconvert
    first = np.load(os.path.join(out, "shard-000000.npy"), mmap_mode="r")
    assert first.shape == (10, 3, 8, 8) and first.dtype == np.float32
    assert cli("verify", out).returncode == 0


def test_zero_copy_views_with_decode_numpy_and_writable_copies_by_default(tmp_path):
    src = str(tmp_path / "arrays")
    saved = arrays(src, n=4, shape=(16, 16, 3), dtype=np.uint8)
    out = str(tmp_path / "cache")
    convert(src, out, "npy", workers=1)
    view = open_dataset(out, decode="numpy")[2]["npy"]
    assert not view.flags.writeable and not view.flags.owndata  # a view of the map
    copy = open_dataset(out)[2]["npy"]
    assert copy.flags.writeable
    np.testing.assert_array_equal(view, saved["0002"])
    np.testing.assert_array_equal(copy, saved["0002"])


class _Payload:
    """Unpickling this writes a file: the proof that something unpickled it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.mark.slow
def test_other_shapes_dtypes_and_hostile_headers_are_counted_skips_never_unpickled(tmp_path):
    src = tmp_path / "arrays"
    saved = arrays(str(src), n=6, shape=(4, 4), dtype=np.float32)
    np.save(src / "a_shape.npy", np.zeros((5, 4), np.float32))
    np.save(src / "b_dtype.npy", np.zeros((4, 4), np.float64))
    witness = tmp_path / "unpickled"
    np.save(src / "c_pickle.npy", np.array([_Payload(str(witness))], dtype=object), allow_pickle=True)
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 4)})
    (src / "d_huge.npy").write_bytes(buf.getvalue() + b"\0" * 64)  # declares 16 TB, holds 64 bytes
    whole = (src / "0000.npy").read_bytes()
    (src / "e_truncated.npy").write_bytes(whole[:-10])
    (src / "f_text.npy").write_bytes(b"not an array at all")
    out = str(tmp_path / "cache")
    run = cli("shard", str(src), "--format", "npy", "-o", out, "-q")
    assert run.returncode == 3, run.stderr  # finished, with skipped inputs
    assert not witness.exists()
    ds = open_dataset(out)
    assert sorted(ds[i]["__key__"] for i in range(len(ds))) == sorted(saved)
    reasons = {os.path.basename(s["path"]): s["reason"] for s in ds.manifest.skipped}
    assert set(reasons) == {"a_shape.npy", "b_dtype.npy", "c_pickle.npy", "d_huge.npy", "e_truncated.npy",
                            "f_text.npy"}
    assert "shape (5, 4), not the cache's float32 (4, 4)" in reasons["a_shape.npy"]
    assert "float64" in reasons["b_dtype.npy"]
    assert "pickled objects" in reasons["c_pickle.npy"]
    assert "declares" in reasons["d_huge.npy"] and "declares" in reasons["e_truncated.npy"]
    assert "not a .npy array" in reasons["f_text.npy"]
    assert all("\n" not in r for r in reasons.values())


def test_the_first_loadable_array_fixes_the_shape_and_none_is_a_one_line_error(tmp_path):
    src = tmp_path / "arrays"
    src.mkdir()
    (src / "0000.npy").write_bytes(b"\x93NUMPY garbage")  # first in order, unreadable: skipped, not the shape
    np.save(src / "0001.npy", np.ones((2, 3), np.int16))
    np.save(src / "0002.npy", np.ones((2, 3), np.int16))
    m = convert(str(src), str(tmp_path / "cache"), "npy", workers=1).manifest
    assert m.num_samples == 2 and len(m.skipped) == 1
    bad = tmp_path / "bad"
    bad.mkdir()
    np.save(bad / "0000.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(SourceError, match="none of the first 1 .npy files is a loadable numeric array"):
        convert(str(bad), str(tmp_path / "cache2"), "npy", workers=1)
    with pytest.raises(Exception, match="packed as they are"):
        convert(str(src), str(tmp_path / "cache3"), "npy", resize=32, workers=1)


@pytest.mark.slow
def test_a_damaged_cache_is_refused_when_opened(tmp_path):
    src = str(tmp_path / "arrays")
    arrays(src, n=4, shape=(2, 2))
    out = tmp_path / "cache"
    convert(src, str(out), "npy", workers=1)
    shard = out / "shard-000000.npy"
    assert open_arrays(str(shard), 4).shape == (4, 2, 2)
    data = shard.read_bytes()
    shard.write_bytes(data[:-4])  # truncated: the header's count no longer fills the file
    with pytest.raises(Exception, match="not 4 numeric arrays filling the file"):
        open_arrays(str(shard), 4)
    assert cli("verify", str(out)).returncode != 0


@pytest.mark.slow
def test_diagnose_prints_the_npy_cache_for_np_load_and_it_runs_as_printed(tmp_path):
    """A job whose workers np.load one small file a sample: the fix is the packed npy cache,
    and the command exits 0 as printed. Before: ``--format wds`` (tar shards of .npy members,
    still one np.load a sample)."""
    src = str(tmp_path / "arrays")
    saved = arrays(src, n=30, shape=(64, 64, 3), dtype=np.uint8)
    fx = Fixes(src, shard_formats(src))
    apply_fixes("read", fx, {"np.load": 0.5}, "pil")
    assert len(fx.commands) == 1 and " --format npy " in fx.commands[0], fx.commands
    command = fx.commands[0].split("   #", 1)[0]
    run = cli(*command.split()[1:], "-q")
    assert run.returncode == 0, run.stderr
    out = command.split(" -o ", 1)[1].strip()
    ds = open_dataset(out)
    assert {ds[i]["__key__"] for i in range(len(ds))} == set(saved)
    # other per-file reads keep the tar shards
    fx = Fixes(src, shard_formats(src))
    apply_fixes("read", fx, {"Image.open (open + header)": 0.5}, "pil")
    assert " --format wds " in fx.commands[0]
