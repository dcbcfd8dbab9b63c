"""Region decoding through libjpeg's own API (dsconvert/_jpeg_region.c, codecs.region_decode).

The pixels it returns must be the whole decode's, pixel for pixel, for every region, scale and
subsampling; what libjpeg warns about must raise, as the whole-file fast path does; whatever
the bytes, it must not crash. The reference is PyTurboJPEG's whole decode over the same
libjpeg-turbo."""

from __future__ import annotations

import io
import random
import re
import shutil
import subprocess
import threading
import warnings

import numpy as np
import pytest
from PIL import Image

from dsconvert import optional
from dsconvert.codecs import jpeg as codecs  # region_decode and the REGION_EDGE it reads
from dsconvert.errors import BadInputError

from conftest import can_build_extensions, encode

ext = optional.jpeg_region()
needs_ext = pytest.mark.skipif(ext is None, reason="dsconvert's region extension is not built here")


def test_the_extension_is_built_where_it_can_be():
    """Where a compiler, libjpeg's headers and Python's are present, the install built it: a
    silent build failure must not leave every region test skipped."""
    if not can_build_extensions("/usr/include/jpeglib.h"):
        pytest.skip("no compiler or headers to build the extension with")
    assert ext is not None, "setup.py builds dsconvert._jpeg_region; reinstall: pip install -e ."


def turbo():
    tj = pytest.importorskip("turbojpeg")
    from turbojpeg import TJPF_RGB

    instance = optional.turbojpeg()
    if instance is None:
        pytest.skip("libturbojpeg does not load")

    def whole(data: bytes, k: int) -> np.ndarray:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return instance.decode(data, pixel_format=TJPF_RGB, scaling_factor=(1, k) if k > 1 else None)
        except OSError:  # a sampling TurboJPEG 2.x cannot name (4x2, 3x1): djpeg, the same library
            djpeg = shutil.which("djpeg")
            if djpeg is None or not data.startswith(b"\xff\xd8"):
                raise
            ppm = subprocess.run([djpeg, "-scale", f"1/{k}", "-rgb"], input=data, capture_output=True, check=True)
            return np.asarray(Image.open(io.BytesIO(ppm.stdout)).convert("RGB"))

    return tj, whole


def region(data: bytes, k: int, box):
    """region_decode of (top, bottom, left, right) at 1/k."""
    return codecs.region_decode(data, lambda h, w: k, lambda h, w, kk: box)


def inside(pixels, origin, k: int, box):
    """The requested box at 1/k, cut from a region's pixels, and where it lies at 1/k."""
    top, bottom, left, right = box
    t, b, lt, r = top // k, -(-bottom // k), left // k, -(-right // k)
    oy, ox = origin
    return pixels[t - oy:b - oy, lt - ox:r - ox], (t, b, lt, r)


@pytest.fixture(scope="module")
def jpegs(photos):
    """Every layout libjpeg decodes in one pass: 4:4:4, 4:2:2, 4:2:0, grayscale, restart
    markers every 3 MCUs and every MCU row, odd sizes, portrait, a single-pixel-wide strip;
    where cjpeg is installed to write them, 4:4:0, 4:1:1, 3x1, and 4x2 and 2x4 chroma (which
    libjpeg-turbo 2.x crops wrongly at 1/2 and 1/4: those decode their full width)."""
    astronaut, coffee = photos["astronaut"].convert("RGB"), photos["coffee"].convert("RGB")
    out = {}
    for name, sub in (("444", 0), ("422", 1), ("420", 2)):
        out[name] = encode(coffee.resize((601, 401)), quality=90, subsampling=sub)
    out["gray"] = encode(astronaut.convert("L").resize((333, 517)), quality=85)
    out["restart-3"] = encode(astronaut.resize((500, 375)), quality=90, restart_marker_blocks=3)
    out["restart-row"] = encode(coffee.resize((375, 500)), quality=90, restart_marker_rows=1)
    out["odd"] = encode(coffee.resize((257, 301)), quality=75)
    out["strip"] = encode(astronaut.resize((1, 300)), quality=90)
    out["large"] = encode(astronaut.resize((1700, 1300)), quality=92)
    cjpeg = shutil.which("cjpeg")
    if cjpeg:
        ppm = encode(coffee.resize((403, 299)), "PPM")
        for name, sample in (("440", "1x2,1x1,1x1"), ("411", "4x1,1x1,1x1"), ("4x2", "4x2,1x1,1x1"),
                             ("2x4", "2x4,1x1,1x1"), ("3x1", "3x1,1x1,1x1")):
            out[name] = subprocess.run([cjpeg, "-sample", sample, "-quality", "90"], input=ppm,
                                       capture_output=True, check=True).stdout
    if ext is not None:  # each rewritten with a restart marker every MCU: decoded from its segments
        for name in [n for n in out if not n.startswith("restart")]:
            out[f"{name}-marked"] = ext.restart(out[name])
    return out


@needs_ext
def test_a_region_is_the_whole_decode_pixel_for_pixel(jpegs):
    _, whole = turbo()
    rng = random.Random(0)
    checked = 0
    for name, data in jpegs.items():
        width, height = Image.open(io.BytesIO(data)).size
        for k in (1, 2, 4, 8):
            full = whole(data, k)
            for _ in range(25):
                top, left = rng.randrange(height), rng.randrange(width)
                box = (top, rng.randint(top + 1, height), left, rng.randint(left + 1, width))
                decoded = region(data, k, box)
                assert decoded is not None, name
                pixels, kk, origin = decoded
                got, (t, b, lt, r) = inside(pixels, origin, k, box)
                assert kk == k and origin[0] <= t and origin[1] <= lt
                assert np.array_equal(got, full[t:b, lt:r]), (name, k, box)
                checked += 1
    assert checked >= 1500 + 1000 * bool(shutil.which("cjpeg"))


@needs_ext
def test_without_the_edge_the_pixels_would_differ(jpegs, monkeypatch):
    """The edge decoded beyond the region is what makes it exact: without it, the chroma
    upsampling at the region's border differs (so the test above can fail)."""
    _, whole = turbo()
    monkeypatch.setattr(codecs, "REGION_EDGE", 0)
    rng = random.Random(1)
    data, differ = jpegs["420"], 0
    full = whole(data, 1)
    for _ in range(40):
        top, left = rng.randrange(8, 300), rng.randrange(8, 400)
        box = (top, top + 100, left, left + 150)
        pixels, _, origin = region(data, 1, box)
        got, (t, b, lt, r) = inside(pixels, origin, 1, box)
        differ += not np.array_equal(got, full[t:b, lt:r])
    assert differ > 10


@needs_ext
def test_what_it_does_not_decode_in_one_pass_is_declined(jpegs, photos):
    coffee = photos["coffee"].convert("RGB").resize((300, 200))
    assert region(encode(coffee, quality=90, progressive=True), 1, (0, 10, 0, 10)) is None
    assert region(encode(coffee.convert("CMYK"), quality=90), 1, (0, 10, 0, 10)) is None
    with pytest.raises(ValueError, match="libjpeg"):
        region(encode(coffee, "PNG"), 1, (0, 10, 0, 10))
    # a region wholly below the image: nothing to decode, the caller decodes in full
    assert region(jpegs["420"], 1, (5000, 5001, 0, 1)) is None


@needs_ext
def test_truncation_raises_wherever_the_region_falls_and_damage_below_is_not_seen(jpegs):
    _, whole = turbo()
    data = jpegs["420"]
    for box in ((0, 20, 0, 50), (150, 200, 300, 400), (350, 401, 0, 601)):
        for cut in (len(data) // 2, len(data) - 2, len(data) - 1):
            with pytest.raises(ValueError, match="libjpeg"):
                region(data[:cut], 1, box)
    junk = data[:-2] + b"\x00" * 7 + b"\xff\xd9"  # Pillow decodes it, libjpeg warns at the end
    pixels, _, origin = region(junk, 1, (10, 60, 20, 80))
    got, (t, b, lt, r) = inside(pixels, origin, 1, (10, 60, 20, 80))
    assert np.array_equal(got, whole(data, 1)[t:b, lt:r])
    with pytest.raises(ValueError, match="extraneous"):  # a region to the last row reads it
        region(junk, 1, (300, 401, 20, 80))


@needs_ext
def test_a_damaged_file_gives_the_whole_decodes_pixels_or_raises(jpegs):
    """Random damage anywhere (bytes overwritten, cut, inserted; in the headers or the scan):
    the extension never crashes, and the pixels it returns are always those libjpeg decodes
    from the same bytes in full, in the region asked for."""
    _, whole = turbo()
    rng = random.Random(7)
    seeds = [jpegs[name] for name in ("420", "444", "gray", "restart-3", "restart-row")]
    returned = 0
    for _ in range(600):
        data = bytearray(rng.choice(seeds))
        what = rng.random()
        if what < 0.5:
            for _ in range(rng.randint(1, 3)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif what < 0.7:
            data = data[:rng.randrange(len(data))]
        elif what < 0.85:
            at = rng.randrange(len(data))
            data[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 9)))
        else:
            data[rng.randrange(2, 700)] = rng.randrange(256)
        data = bytes(data)
        k = rng.choice((1, 2, 4, 8))
        asked = []

        def box(h: int, w: int, kk: int, asked=asked):
            asked.append((rng.randrange(h), h + 5, rng.randrange(w), w))
            return asked[0]

        try:
            decoded = codecs.region_decode(data, lambda h, w, k=k: k, box)
        except ValueError:
            continue
        except BadInputError:
            continue  # a damaged header declaring a frame past the pixel limit
        if decoded is None:
            continue
        pixels, _, origin = decoded
        try:
            full = whole(data, k)
        except Exception:
            continue  # an error libjpeg raises below the region, which it never reached
        got, (t, b, lt, r) = inside(pixels, origin, k, asked[0])
        assert np.array_equal(got, full[t:b, lt:r])
        returned += 1
    assert returned > 100


@needs_ext
def test_the_plan_decides_and_its_errors_propagate(jpegs):
    data = jpegs["420"]
    assert ext.region(data, lambda h, w: None) is None
    seen = []
    ext.region(data, lambda h, w: seen.append((h, w)) or (1, 0, 1, 0, 1))
    assert seen == [(401, 601)]
    for bad in ((3, 0, 1, 0, 1), (1, 5, 5, 0, 1), (1, 0, 1, -1, 1)):
        with pytest.raises(ValueError, match="bad plan"):
            ext.region(data, lambda h, w, bad=bad: bad)
    with pytest.raises(TypeError):
        ext.region(data, lambda h, w: "rows")
    with pytest.raises(KeyError):
        ext.region(data, lambda h, w: {}["x"])


@needs_ext
def test_a_frame_past_the_pixel_limit_is_refused_before_allocating(jpegs):
    data = bytearray(jpegs["420"])
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = (30000).to_bytes(2, "big") * 2  # 900 million pixels declared
    with pytest.raises(BadInputError, match="decompression bomb"):
        region(bytes(data), 1, (0, 10, 0, 10))


@needs_ext
def test_threads_decode_at_once(jpegs):
    """The decode runs without the GIL: threads get the same pixels as one after another."""
    data = jpegs["large"]
    boxes = [(i * 40, i * 40 + 300, i * 50, i * 50 + 400) for i in range(16)]
    expected = [region(data, 2, box)[0] for box in boxes]
    results = {}

    def work(i: int) -> None:
        results[i] = region(data, 2, boxes[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(results[i], expected[i]) for i in range(16))


def restart_segments(data: bytes):
    """(start, end) of each restart segment of a baseline JPEG's scan."""
    scan = data.index(b"\xff\xda")
    scan += 2 + int.from_bytes(data[scan + 2:scan + 4], "big")
    cuts = [m.start() for m in re.finditer(rb"\xff[\xd0-\xd7]", data[scan:])]
    starts = [scan] + [scan + c + 2 for c in cuts]
    ends = [scan + c for c in cuts] + [data.rindex(b"\xff\xd9")]
    return list(zip(starts, ends))


@needs_ext
def test_restart_marking_keeps_every_pixel_and_every_marker(jpegs, photos):
    """The rewrite copies the DCT coefficients: every scale decodes to the same pixels; APPn
    (an ICC profile, EXIF) survive; the interval is one MCU."""
    _, whole = turbo()
    rewritten = 0
    for name, data in jpegs.items():
        if name.endswith("-marked") or name.startswith("restart"):
            continue
        marked = ext.restart(data)
        assert marked is not None and b"\xff\xdd\x00\x04\x00\x01" in marked, name
        for k in (1, 2, 4, 8):
            assert np.array_equal(whole(marked, k), whole(data, k)), (name, k)
        rewritten += 1
    assert rewritten >= 6
    img = photos["coffee"].convert("RGB").resize((200, 150))
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation
    icc = b"\x00" * 64 + b"not a real profile"
    data = encode(img, quality=90, icc_profile=icc, exif=exif.tobytes())
    marked = Image.open(io.BytesIO(codecs.restart_marked(data)))
    assert marked.info.get("icc_profile") == icc and marked.getexif()[0x0112] == 6


@needs_ext
def test_restart_marking_declines_what_it_cannot_help(jpegs, photos):
    coffee = photos["coffee"].convert("RGB").resize((300, 200))
    for data in (encode(coffee, quality=90, progressive=True), encode(coffee.convert("CMYK"), quality=90),
                 ext.restart(jpegs["420"])):
        assert ext.restart(data) is None
        assert codecs.restart_marked(data) is data
    png = encode(coffee, "PNG")
    assert codecs.restart_marked(png) is png
    truncated = jpegs["420"][:len(jpegs["420"]) // 2]
    with pytest.raises(ValueError, match="libjpeg"):
        ext.restart(truncated)
    assert codecs.restart_marked(truncated) is truncated


@needs_ext
def test_segments_outside_the_region_are_not_read(jpegs):
    """In a restart-marked file the region's pixels come from its own segments only: damage in a
    segment above and left of the region, which decoding every row above would read (libjpeg
    refuses the file or its pixels change), leaves them exact."""
    _, whole = turbo()
    marked = ext.restart(jpegs["420"])  # 601 x 401, 4:2:0: 38 MCUs a row
    segments = restart_segments(marked)
    assert len(segments) == 38 * 26
    damaged = bytearray(marked)
    for row in (2, 3):
        start, end = segments[row * 38 + 3]
        damaged[start:end] = b"\x5a" * (end - start)
    damaged = bytes(damaged)
    try:
        full = ext.region(damaged, lambda h, w: (1, 0, h, 0, w))
        reading_it_differs = not np.array_equal(np.frombuffer(full[0], np.uint8).reshape(401, 601, 3),
                                                whole(marked, 1))
    except ValueError:
        reading_it_differs = True
    assert reading_it_differs
    box = (100, 300, 200, 500)  # below and right of the damage
    pixels, _, origin = region(damaged, 1, box)
    got, (t, b, lt, r) = inside(pixels, origin, 1, box)
    assert np.array_equal(got, whole(jpegs["420"], 1)[t:b, lt:r])


@needs_ext
def test_a_misnumbered_or_missing_marker_decodes_as_before(jpegs):
    """Segments are used only where every marker is there in sequence up to EOI; otherwise the
    file goes the whole way, where libjpeg's warning refuses it as for any damaged file."""
    marked = ext.restart(jpegs["420"])
    segments = restart_segments(marked)
    start, _ = segments[500]
    misnumbered = bytearray(marked)
    misnumbered[start - 1] = 0xD0 + (misnumbered[start - 1] - 0xD0 + 3) % 8
    missing = marked[:start - 2] + marked[start:]
    for bad in (bytes(misnumbered), missing):
        with pytest.raises(ValueError, match="libjpeg"):
            region(bad, 1, (300, 380, 100, 200))
