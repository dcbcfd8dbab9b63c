"""The scale benchmark's generated sources are what they claim: tars that ``tarfile``, GNU tar
and dsconvert's own scan read as ``KEY.cls`` + ``KEY.jpg`` pairs (the fast raw-bytes writer must
stay a valid archive), and a tree of the same samples."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile

import pytest
from PIL import Image

from benchmarks import scale


def test_tars_read_back_with_tarfile(tmp_path):
    root = str(tmp_path / "tars")
    scale.make_tars(root, 25, per_tar=10)
    names = sorted(f for f in os.listdir(root) if f.endswith(".tar"))
    assert names == ["part-000000.tar", "part-000001.tar", "part-000002.tar"]
    blobs = scale._blobs()
    seen = 0
    for name in names:
        with tarfile.open(os.path.join(root, name)) as tf:
            members = tf.getmembers()
            assert all(m.isreg() for m in members)
            for cls, jpg in zip(members[::2], members[1::2]):
                i = int(cls.name[1:10])
                assert (cls.name, jpg.name) == (f"s{i:09d}.cls", f"s{i:09d}.jpg")
                assert tf.extractfile(cls).read() == str(i % scale.CLASSES).encode()
                data = tf.extractfile(jpg).read()
                assert data == blobs[i % scale.BLOBS]
                seen += 1
        assert os.path.getsize(os.path.join(root, name)) % (20 * 512) == 0  # whole records, as tarfile pads
    assert seen == 25


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar is not installed")
def test_tars_list_with_gnu_tar(tmp_path):
    root = str(tmp_path / "tars")
    scale.make_tars(root, 12, per_tar=10)
    listing = subprocess.run(["tar", "-tf", os.path.join(root, "part-000001.tar")], check=True,
                             capture_output=True, text=True).stdout.split()
    assert listing == ["s000000010.cls", "s000000010.jpg", "s000000011.cls", "s000000011.jpg"]


def test_tars_convert_with_labels(tmp_path):
    from dsconvert import convert, open_dataset

    root = str(tmp_path / "tars")
    scale.make_tars(root, 30, per_tar=10)
    out = str(tmp_path / "out")
    convert(root, out, format="wds", label="cls")
    ds = open_dataset(out, decode="raw")
    assert len(ds) == 30
    labels = sorted(int(ds[i][1]) for i in range(30))
    assert labels == list(range(30))


def test_tree_holds_the_same_samples(tmp_path):
    root = str(tmp_path / "tree")
    scale.make_tree(root, 7)
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if f.endswith(".jpg"))
    assert len(files) == 7
    with Image.open(files[0]) as im:
        assert im.size == (32, 32)


def _row(n, parent, peers=None):
    reads = {"open_seconds": 0.1, "first_batch_seconds": 0.2, "worker_private": [10e6, 11e6],
             "worker_private_dirty": [9e6, 9e6]}
    row = {"kind": "tree", "samples": n, "convert_seconds": 1.0, "convert_cpu_seconds": 1.0,
           "convert_parent_rss": parent, "convert_worker_rss": 40e6, "verify_rss": 50e6, "verify_seconds": 1.0,
           "record_bytes": 40 * n, "map": reads, "stream": reads}
    if peers:
        row["peers"] = peers
    return row


def test_growth_and_peer_rows_render():
    def peer(rss):
        return {"webdataset": {"seconds": 2.0, "cpu_seconds": 1.5, "parent_rss": rss, "child_rss": 0}}

    rows = [_row(1000, 50e6, peer(600e6)), _row(10000, 50e6 + 9000 * 10, peer(600e6 + 9000 * 100)),
            _row(100000, 50e6 + 99000 * 10)]  # the peers left out at the largest size
    growth = {g["figure"]: g for g in scale.growth(rows)}
    steps = growth["conversion parent, peak RSS"]["steps"]
    assert [round(s["bytes_per_sample"], 6) for s in steps] == [10.0, 10.0]
    text = scale.render_text({"tree": {"rows": rows, "growth": scale.growth(rows)}})
    line = next(ln for ln in text.splitlines() if ln.startswith("| webdataset `ShardWriter` (1 process)"))
    assert "| 600 MB | 601 MB | – | 100.0 B |" in line
    assert "litdata" not in text  # not run: no row


def test_a_commands_peak_is_its_own_not_the_runners():
    """Linux's wait4 ru_maxrss counts the spawning process's memory at the exec: a runner holding
    more than the command made every peak read the runner's. The sampled high-water mark is the
    command's own."""
    import sys

    held = bytearray(300 << 20)  # the runner holds 300 MB
    held[::4096] = b"x" * len(held[::4096])  # touched: resident
    r = scale.run_sampled([sys.executable, "-c", "x = bytearray(40 << 20); x[::4096] = b'y' * len(x[::4096]); "
                           "import time; time.sleep(0.3)"])
    assert 40 << 20 < r["peak_rss"] < 200 << 20
    del held
