"""Opening a shuffled output leaves no page of its order file in the opening process: the
sha256 check reads every page, and at 10M samples that was 80 MB of the trainer's memory
(the page cache keeps the pages; a read maps back the one it needs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dsconvert import convert
from dsconvert.manifest import ORDER_NAME


def _resident_kb(name: str) -> int:
    """Resident kB of this process's mappings of files called ``name``."""
    total, inside = 0, False
    with open(f"/proc/{os.getpid()}/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not line.startswith(("Rss", "Pss", "Private", "Shared")):
                inside = len(parts) > 5 and os.path.basename(parts[5]) == name
            elif inside and line.startswith("Rss:"):
                total += int(parts[1])
    return total


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc")
def test_the_order_files_pages_leave_the_opening_process(tmp_path):
    from benchmarks.scale import make_tree

    src, out = str(tmp_path / "tree"), str(tmp_path / "out")
    make_tree(src, 20000)  # 20,000 tiny JPEGs: an order file of 160 kB
    convert(src, out, format="wds")  # an ImageFolder into wds: a shuffled order
    assert os.path.getsize(os.path.join(out, ORDER_NAME)) > 150 << 10
    # a fresh process opens it, as a trainer does (this one wrote the file and mapped it too)
    here = os.path.dirname(__file__)
    code = (f"import sys; sys.path.insert(0, {here!r}); from test_open_memory import _resident_kb; "
            f"from dsconvert import open_dataset; ds = open_dataset({out!r}, decode='raw'); "
            f"print(_resident_kb({ORDER_NAME!r})); assert ds[0] is not None and ds[len(ds) - 1] is not None")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # hashed, its pages dropped; reading its header maps back what the kernel's fault-around
    # maps with it (64 kB by default), not the file
    assert int(done.stdout.split()[-1]) <= 64
