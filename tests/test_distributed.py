"""Real torch.distributed ranks (gloo on 127.0.0.1), each with DataLoader workers."""

import hashlib
import json
import os
import socket
import subprocess
import sys

import pytest

from dsconvert import convert

from conftest import make_image_folder

pytest.importorskip("torch.distributed")

RANK_SCRIPT = r"""
import hashlib, json, os, sys
import torch.distributed as dist
from torch.utils.data import DataLoader
from dsconvert import open_dataset

if __name__ == "__main__":
    out, result, even, context = sys.argv[1], sys.argv[2], sys.argv[3] or None, sys.argv[4]
    dist.init_process_group("gloo", init_method="env://")  # RANK, WORLD_SIZE, MASTER_* from env
    del os.environ["RANK"], os.environ["WORLD_SIZE"]  # from here only torch.distributed knows
    ds = open_dataset(out, decode="raw", even=even, shuffle=True, seed=3)
    ds.set_epoch(1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
    digests = [hashlib.sha1(raw).hexdigest() for raw, _ in loader]
    with open(result, "w") as f:
        json.dump({"rank": dist.get_rank(), "len": len(ds), "digests": digests}, f)
    dist.destroy_process_group()
"""


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("even, context", [("", "fork"), ("drop", "spawn")])
def test_ranks_from_torch_distributed_read_exactly_once(tmp_path, photos, even, context):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 11, "b": 10}, size=(24, 16))
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=4, workers=1)  # 21 samples, 6 shards
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script), out, str(tmp_path / f"r{rank}.json"), even, context],
                                      env=env))
    for p in procs:
        assert p.wait(timeout=120) == 0
    results = [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(2)]
    everything = sorted(hashlib.sha1(open(os.path.join(d, f), "rb").read()).hexdigest()
                        for d, _, fs in os.walk(src) for f in fs)
    got = sorted(d for r in results for d in r["digests"])
    if even == "drop":
        assert [r["len"] for r in results] == [10, 10] and len(set(got)) == 20 and set(got) <= set(everything)
    else:
        assert sorted(r["len"] for r in results) == [10, 11] and got == everything
    for r in results:
        assert len(r["digests"]) == r["len"]
