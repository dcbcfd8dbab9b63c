"""The README's first two Python blocks (the drop-in and the Quickstart) run as written, on a
small ImageFolder put where they name their folders."""

import os
import re
import socket

import pytest

from dsconvert import convert

from conftest import make_image_folder

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def python_blocks(path=README):
    return re.findall(r"```python\n(.*?)```", open(path, encoding="utf-8").read(), re.S)


def _run(block, paths):
    for name, path in paths.items():
        block = block.replace(name, path)
    exec(compile(block, README, "exec"), {"__name__": "__readme__"})


@pytest.fixture
def folders(tmp_path, photos):
    src = str(tmp_path / "data" / "train")
    make_image_folder(src, photos, {"cat": 9, "dog": 7}, size=(300, 240))
    return {"/data/train": src, "/ssd/train-wds": str(tmp_path / "train-wds"),
            "/ssd/train-npy": str(tmp_path / "train-npy")}


def test_the_drop_in_runs_as_written(folders):
    pytest.importorskip("torchvision")
    convert(folders["/data/train"], folders["/ssd/train-wds"], workers=1)
    _run(python_blocks()[0], folders)


@pytest.mark.slow
def test_the_quickstart_runs_as_written(folders):
    pytest.importorskip("torchvision")
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        _run(python_blocks()[1], folders)
    finally:
        dist.destroy_process_group()
