"""--jpeg-restart: the stored JPEGs rewritten losslessly with a restart marker every MCU, so that
decode="fused" entropy-decodes only the segments a crop needs; the pixels stay the source's."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image

from dsconvert import convert, open_dataset, optional
from dsconvert.errors import OptionError
from dsconvert.source import scan

from conftest import encode, write

pytestmark = pytest.mark.skipif(optional.jpeg_region() is None, reason="dsconvert's region extension is not built")

RESTART_EVERY_MCU = b"\xff\xdd\x00\x04\x00\x01"  # DRI, interval 1


@pytest.fixture
def source(tmp_path, photos):
    """Baseline JPEGs of three subsamplings and odd sizes, a grayscale one, a progressive one
    and a PNG (kept as they are)."""
    root = tmp_path / "src"
    coffee, astronaut = photos["coffee"].convert("RGB"), photos["astronaut"].convert("RGB")
    files = {
        "a/420.jpg": encode(coffee.resize((468, 375)), quality=85),
        "a/444.jpg": encode(astronaut.resize((301, 257)), quality=90, subsampling=0),
        "a/422.jpg": encode(coffee.resize((375, 500)), quality=80, subsampling=1),
        "b/gray.jpg": encode(astronaut.convert("L").resize((333, 275)), quality=85),
        "b/progressive.jpg": encode(coffee.resize((300, 260)), quality=85, progressive=True),
        "b/png.png": encode(astronaut.resize((260, 240)), "PNG"),
    }
    for name, data in files.items():
        write(str(root / name), data)
    return str(root), files


def stored(src: str, out: str):
    """Source path -> stored bytes."""
    paths = [s.files[0].path for s in scan(src).samples]
    return dict(zip(paths, (raw for raw, _ in open_dataset(out, decode="raw"))))


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_stored_jpegs_are_marked_and_decode_to_the_sources_pixels(source, tmp_path, fmt):
    src, files = source
    out = str(tmp_path / fmt)
    m = convert(src, out, format=fmt, jpeg_restart=True, workers=1).manifest
    assert m.options["jpeg_restart"] is True and m.num_samples == len(files)
    images = stored(src, out)
    for path, data in images.items():
        if path.endswith(("progressive.jpg", "png.png")):
            assert data == files[path]  # nothing to gain: kept as they are
            continue
        assert data != files[path] and RESTART_EVERY_MCU in data, path
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), np.asarray(Image.open(io.BytesIO(files[path]))))


def test_fused_samples_are_the_same_as_from_the_unmarked_output(source, tmp_path):
    """The drop-in's promise holds: for the same seed, the same crop boxes and the same pixels
    (train and eval transforms), whether the shards hold the source's bytes or marked ones."""
    from torchvision import transforms as T

    src, _ = source
    plain, marked = str(tmp_path / "plain"), str(tmp_path / "marked")
    convert(src, plain, workers=1)
    convert(src, marked, jpeg_restart=True, workers=1)
    train = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.PILToTensor()])
    evaluation = T.Compose([T.Resize(110), T.CenterCrop(96), T.PILToTensor()])
    for transform in (train, evaluation):
        a, b = (open_dataset(out, transform, decode="fused") for out in (plain, marked))
        for seed in range(40):
            i = seed % len(a)
            torch.manual_seed(seed)
            x, y = a[i]
            torch.manual_seed(seed)
            x2, y2 = b[i]
            assert y == y2 and torch.equal(x, x2), (transform, seed)


def test_a_decoded_output_refuses_it(source, tmp_path):
    src, _ = source
    with pytest.raises(OptionError, match="jpeg_restart"):
        convert(src, str(tmp_path / "npy"), format="npy", jpeg_restart=True)


def test_the_command_line_writes_and_info_says_it(source, tmp_path):
    src, _ = source
    out = str(tmp_path / "cli")
    subprocess.run([sys.executable, "-m", "dsconvert", "shard", src, "-o", out, "--jpeg-restart", "--workers", "1",
                    "-q"],
                   check=True, capture_output=True)
    info = subprocess.run([sys.executable, "-m", "dsconvert", "info", out], check=True, capture_output=True,
                          text=True).stdout
    assert "restart marker every MCU" in info
    assert RESTART_EVERY_MCU in stored(src, out)["a/420.jpg"]
