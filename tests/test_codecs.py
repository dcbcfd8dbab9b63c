import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from dsconvert import BadInputError
from dsconvert.codecs import check_field, check_image, decode_field, decode_image, jpeg_decoders


def test_pil_mode_is_exactly_imagefolders_loader(image_kinds):
    for kind, (_, data) in image_kinds.items():
        img = decode_image(data, "pil")
        ref = Image.open(io.BytesIO(data)).convert("RGB")
        assert img.mode == "RGB" and np.array_equal(np.asarray(img), np.asarray(ref)), kind


def test_numpy_mode_matches_pil_within_one_level(image_kinds):
    for kind, (_, data) in image_kinds.items():
        arr = decode_image(data, "numpy")
        ref = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        assert arr.dtype == np.uint8 and arr.shape == ref.shape, kind
        assert np.abs(arr.astype(int) - ref).mean() <= 1.0, kind


def test_decoder_chain_detects_what_loads():
    names = [n for n, _ in jpeg_decoders()]
    assert names[-1] == "pil"
    # whether PyTurboJPEG and libturbojpeg load here: only the probe is in the try, so a failed
    # assertion fails the test instead of being taken for "turbojpeg is absent"
    try:
        from turbojpeg import TurboJPEG

        TurboJPEG()
    except (ImportError, OSError, RuntimeError, AttributeError):
        # PyTurboJPEG not installed; libturbojpeg not found (RuntimeError), not loadable (OSError)
        # or without the functions this PyTurboJPEG calls (AttributeError)
        loads = False
    else:
        loads = True
    if loads:
        assert names[0] == "turbojpeg"
    else:
        assert "turbojpeg" not in names


def test_raw_mode_returns_bytes(image_kinds):
    data = image_kinds["baseline"][1]
    assert decode_image(data, "raw") is data
    with pytest.raises(ValueError, match="decode must be one of"):
        decode_image(data, "tensor")


def _png_bomb(width: int, height: int) -> bytes:
    """A valid PNG header declaring a huge image, with a tiny compressed body."""
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * (width + 1) * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


@pytest.mark.parametrize("make, reason", [
    (lambda k: b"", "empty file"),
    (lambda k: k["baseline"][1][: len(k["baseline"][1]) // 2], "corrupt or truncated"),
    (lambda k: k["progressive"][1][:-600], "corrupt or truncated"),
    (lambda k: k["png"][1][:-100], "corrupt or truncated"),
    (lambda k: b"this is text, named .jpg\n" * 20, "not a decodable image"),
    (lambda k: bytes(range(256)) * 8, "not a decodable image"),
    (lambda k: _png_bomb(20000, 20000), "decompression bomb"),
])
def test_bad_images_are_rejected_with_reason(image_kinds, make, reason):
    with pytest.raises(BadInputError) as exc:
        check_image(make(image_kinds))
    assert exc.value.reason.startswith(reason)


def test_good_images_pass(image_kinds):
    for _, data in image_kinds.values():
        check_image(data)


def test_pixel_limit_is_adjustable(image_kinds):
    data = image_kinds["baseline"][1]
    with pytest.raises(BadInputError, match="decompression bomb"):
        check_image(data, max_pixels=100)


def test_sidecar_fields():
    check_field("json", b'{"a": [1, 2]}', verify=True)
    check_field("cls", b"12\n", verify=True)
    with pytest.raises(BadInputError, match="not a valid .json"):
        check_field("json", b"{broken", verify=True)
    check_field("json", b"{broken", verify=False)  # only decoded under verify
    with pytest.raises(BadInputError, match="empty file"):
        check_field("jpg", b"", verify=False)  # an empty image is never valid
    buf = io.BytesIO()
    np.save(buf, np.arange(6).reshape(2, 3))
    assert decode_field("npy", buf.getvalue()).tolist() == [[0, 1, 2], [3, 4, 5]]
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError):
        decode_field("npy", pickled.getvalue())  # never unpickles
    assert decode_field("cls", b" 7 ") == 7
    assert decode_field("txt", "héllo".encode()) == "héllo"
    assert decode_field("bin", b"\x00\x01") == b"\x00\x01"


@pytest.mark.parametrize("width, height", [(150, 100), (300, 300)])
def test_a_bomb_is_refused_quoting_the_limit_applied(width, height):
    """Between the limit and twice it Pillow warns, past twice it raises quoting 2 x the limit:
    either way the reason names the pixels and the limit that refused them."""
    data = _png_bomb(width, height)
    with pytest.raises(BadInputError) as exc:
        check_image(data, max_pixels=10_000)
    assert exc.value.reason == (f"decompression bomb: {width * height} pixels exceeds the limit of 10000 "
                                "(PIL.Image.MAX_IMAGE_PIXELS; raise it with --max-image-pixels)")
