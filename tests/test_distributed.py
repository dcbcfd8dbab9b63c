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

pytestmark = [pytest.mark.system, pytest.mark.slow]  # gloo ranks in processes of their own

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


def _gloo_ranks(tmp_path, script_text, args, world=2, timeout=180):
    """Run ``script_text`` as ``world`` gloo ranks on 127.0.0.1 (``args(result_path)``: its
    arguments); the JSON each rank wrote, by rank."""
    script = tmp_path / "rank.py"
    script.write_text(script_text)
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        procs.append(subprocess.Popen([sys.executable, str(script), *args(str(tmp_path / f"r{rank}.json"))], env=env))
    for p in procs:
        assert p.wait(timeout=timeout) == 0
    return [json.loads((tmp_path / f"r{r}.json").read_text()) for r in range(world)]


@pytest.mark.parametrize("even, context", [("", "fork"), ("drop", "spawn")])
def test_ranks_from_torch_distributed_read_exactly_once(tmp_path, photos, even, context):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 11, "b": 10}, size=(24, 16))
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=4, workers=1)  # 21 samples, 6 shards
    results = _gloo_ranks(tmp_path, RANK_SCRIPT, lambda result: [out, result, even, context])
    everything = sorted(hashlib.sha1(open(os.path.join(d, f), "rb").read()).hexdigest()
                        for d, _, fs in os.walk(src) for f in fs)
    got = sorted(d for r in results for d in r["digests"])
    if even == "drop":
        assert [r["len"] for r in results] == [10, 10] and len(set(got)) == 20 and set(got) <= set(everything)
    else:
        assert sorted(r["len"] for r in results) == [10, 11] and got == everything
    for r in results:
        assert len(r["digests"]) == r["len"]


DROPIN_SCRIPT = r"""
import hashlib, json, os, sys
import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from PIL import Image
from dsconvert import open_dataset


def to_array(image):
    return torch.from_numpy(np.array(image))


class Reference(Dataset):
    # torchvision's ImageFolder where it imports, else its make_dataset and pil_loader as written there
    def __init__(self, root):
        try:
            from torchvision.datasets import ImageFolder
            self.samples = ImageFolder(root).samples
        except Exception:
            exts = (".jpg", ".jpeg", ".png")
            classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
            self.samples = [(os.path.join(d, f), i) for i, c in enumerate(classes)
                            for d, _, fs in sorted(os.walk(os.path.join(root, c))) for f in sorted(fs)
                            if f.lower().endswith(exts)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, label = self.samples[i]
        with open(path, "rb") as f:
            return to_array(Image.open(f).convert("RGB")), label


def digests(loader):
    return [[hashlib.sha1(images.numpy().tobytes()).hexdigest(), labels.tolist()] for images, labels in loader]


if __name__ == "__main__":
    src, out, result = sys.argv[1:4]
    dist.init_process_group("gloo", init_method="env://")
    del os.environ["RANK"], os.environ["WORLD_SIZE"]
    got = {}
    for name, ds in (("ours", open_dataset(out, transform=to_array)), ("imagefolder", Reference(src))):
        sampler = DistributedSampler(ds, shuffle=True, seed=4)
        sampler.set_epoch(2)
        got[name] = digests(DataLoader(ds, batch_size=4, sampler=sampler, num_workers=2))
    for name, batch, kw in (("stream", 4, {}), ("stream_dealt", 5, {"batch_size": 5, "collate": False})):
        stream = open_dataset(out, decode="raw", shuffle=True, **kw)  # even="pad" by default
        loader = DataLoader(stream, batch_size=batch, num_workers=2)
        steps = list(loader)
        t = torch.tensor([len(steps)])
        for _ in steps:  # a per-step collective: ranks with unequal steps would hang or fail here
            dist.all_reduce(torch.ones(1))
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        got[name] = [len(steps), int(t), len(loader)]
    with open(result, "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()
"""


def test_distributed_sampler_over_gloo_ranks_gives_imagefolders_batches(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 11, "b": 10}, size=(24, 16))
    out = str(tmp_path / "out")
    convert(src, out, samples_per_shard=4, workers=1)  # 21 samples: ranks of 11 and 10 unless padded
    results = _gloo_ranks(tmp_path, DROPIN_SCRIPT, lambda result: [src, out, result])
    for r in results:
        assert r["ours"] == r["imagefolder"] and len(r["ours"]) == 3  # 11 samples a rank (padded): 4, 4, 3
        # the stream: every rank as many steps (unpadded, batches of 5 dealt whole would give the
        # ranks 3 and 2 steps, and the collective would fail); dealt whole, len(loader) is exact
        assert r["stream"][0] == r["stream"][1] and r["stream_dealt"] == [3, 3, 3]
