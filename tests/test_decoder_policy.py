"""One decoder policy (issue 33, class 4): a file is accepted only where every path accepts it.
Each path (the conversion's check, decode="pil", "numpy", "fused" with each geometry, decoded
outputs) gets the same JPEGs and must agree, and what it refuses is a BadInputError."""

import io
import os
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from dsconvert import convert
from dsconvert.codecs import check_field, decode_errors_naming, decode_image, decode_resized
from dsconvert.errors import BadInputError
from dsconvert.fused import fuse
from dsconvert.transforms import CropToTensor, RandomResizedCropToTensor

from conftest import encode, make_image_folder, write


def _paths():
    """Every way a JPEG is decoded, as (name, function of the bytes)."""
    yield "check", lambda d: check_field("jpg", d, True)
    yield "pil", lambda d: decode_image(d, "pil")
    yield "numpy", lambda d: decode_image(d, "numpy")
    yield "fused rrc", lambda d: fuse(RandomResizedCropToTensor(32)).from_bytes(d)
    yield "fused eval", lambda d: fuse(CropToTensor(56, resize=64)).from_bytes(d)
    yield "decoded output", lambda d: decode_resized(d, "pil", resize=64)
    fast = "turbojpeg"
    yield "decoded output, fast", lambda d: decode_resized(d, fast, resize=64)


def _verdicts(data):
    out = {}
    for name, fn in _paths():
        try:
            with decode_errors_naming("sample"):  # what every reader wraps its decode in
                fn(data)
            out[name] = "accepted"
        except BadInputError as exc:
            out[name] = f"refused: {exc.reason[:40]}"
    return out


def _noise_jpeg(shape=(300, 400)):
    pixels = np.random.default_rng(0).integers(0, 256, shape + (3,), dtype=np.uint8)
    return encode(Image.fromarray(pixels), quality=80)


@pytest.mark.parametrize("cut", ["headers only", "headers and EOI", "headers and the scan header"])
def test_a_jpeg_without_a_scan_is_refused_alike_on_every_path(cut):
    data = _noise_jpeg()
    sos = data.index(b"\xff\xda")
    broken = {"headers only": data[:sos], "headers and EOI": data[:sos] + b"\xff\xd9",
              "headers and the scan header": data[:sos + 14]}[cut]
    verdicts = _verdicts(broken)
    assert all(v.startswith("refused") for v in verdicts.values()), verdicts


def _cjpeg(img, *args):
    if not shutil.which("cjpeg"):
        pytest.skip("cjpeg is not installed (apt-get install libjpeg-turbo-progs)")
    buf = io.BytesIO()
    img.save(buf, "PPM")
    return subprocess.run(["cjpeg", *args], input=buf.getvalue(), capture_output=True, check=True).stdout


@pytest.mark.parametrize("case", ["small", "over 64 kB", "truncated, EOI appended", "truncated"])
def test_arithmetic_coded_jpegs_are_refused_alike_on_every_path(case, photos):
    """libjpeg decodes a truncated arithmetic scan as zeros without a warning (50 levels off,
    accepted by every decoder), and Pillow refuses whole ones past about 64 kB while the fast
    decoders take them: no path can verify one, so every path refuses them, with the fix."""
    photo = next(iter(photos.values())).convert("RGB")
    img = photo.resize((600, 450)) if case == "over 64 kB" else photo.resize((120, 90))
    data = _cjpeg(img, "-arithmetic", "-quality", "95")
    if case == "over 64 kB":
        assert len(data) > 65536
    if case.startswith("truncated"):
        data = data[: len(data) * 2 // 3] + (b"\xff\xd9" if "EOI" in case else b"")
    verdicts = _verdicts(data)
    assert all(v.startswith("refused: arithmetic-coded JPEG") for v in verdicts.values()), verdicts
    # the same file Huffman-coded is accepted everywhere
    assert set(_verdicts(encode(img, quality=95)).values()) == {"accepted"}


def test_a_conversion_counts_arithmetic_jpegs_as_skipped_with_the_fix(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3}, size=(40, 30))
    write(os.path.join(src, "a", "z_arith.jpg"), _cjpeg(next(iter(photos.values())).convert("RGB"), "-arithmetic"))
    m = convert(src, str(tmp_path / "out"), workers=1).manifest
    assert m.num_samples == 3
    assert [(s["path"], s["reason"][:21]) for s in m.skipped] == [("a/z_arith.jpg", "arithmetic-coded JPEG")]
    assert "jpegtran" in m.skipped[0]["reason"]
