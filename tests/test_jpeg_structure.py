"""Verification without decoding: whatever jpeg_structure.whole accepts, Pillow must decode.

Real JPEGs of every kind Pillow writes are mutated thousands of ways (truncated, bytes
replaced, inserted, deleted, bits flipped, segments duplicated or dropped, lengths and table
entries rewritten); for every mutant, ``whole(m)`` must imply that a full Pillow decode raises
nothing. The reverse does not matter (a False only means "decode to find out")."""

from __future__ import annotations

import io
import random
import struct

import pytest
from PIL import Image

from dsconvert.codecs import check_image
from dsconvert.errors import BadInputError
from dsconvert.jpeg_structure import whole

from conftest import encode

# Pillow reads EXIF when it opens a JPEG and warns about the mutants' broken EXIF: expected here
pytestmark = pytest.mark.filterwarnings("ignore:Corrupt EXIF data:UserWarning")


def pillow_decodes(data: bytes) -> bool:
    try:
        with Image.open(io.BytesIO(data)) as img:
            img.convert("RGB")
        return True
    except Exception:
        return False


@pytest.fixture(scope="module")
def corpus(photos):
    """name -> (bytes, whether whole() should accept the intact file)."""
    rgb = photos["astronaut"].convert("RGB").resize((120, 90))
    big = photos["coffee"].convert("RGB").resize((300, 200))
    return {
        "baseline 4:2:0": (encode(rgb, quality=90), True),
        "4:4:4": (encode(rgb, quality=95, subsampling=0), True),
        "4:2:2": (encode(rgb, quality=75, subsampling=1), True),
        "optimized tables": (encode(big, quality=85, optimize=True), True),
        "grayscale": (encode(photos["camera"].convert("L").resize((100, 80))), True),
        "cmyk": (encode(rgb.convert("CMYK")), False),
        "exif and icc": (encode(rgb, exif=Image.Exif(), icc_profile=b"\0" * 300), True),
        "restart markers": (encode(big, restart_marker_rows=1), True),
        "progressive": (encode(rgb, progressive=True), False),
        "1x1": (encode(rgb.resize((1, 1))), True),
    }


def test_intact_files_are_whole_and_progressive_ones_are_decoded(corpus):
    for name, (data, accepted) in corpus.items():
        assert whole(data) is accepted, name
        assert pillow_decodes(data), name


def segments(data: bytes):
    """(offset, marker, length) of each marker segment before the scan data."""
    out, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        out.append((pos, marker, length))
        if marker == 0xDA:
            break
        pos += 2 + length
    return out


def mutants(data: bytes, rng: random.Random, n: int):
    segs = segments(data)
    header_end = segs[-1][0] + 2 + segs[-1][2] if segs else 100
    for _ in range(n):
        kind = rng.randrange(9)
        m = bytearray(data)
        at = rng.randrange(len(m)) if rng.random() < 0.5 else rng.randrange(min(len(m), header_end + 8))
        if kind == 0:
            m = m[:at]
        elif kind == 1:
            m[at] = rng.randrange(256)
        elif kind == 2:
            m[at] ^= 1 << rng.randrange(8)
        elif kind == 3:
            m[at:at] = bytes([rng.choice([0xFF, 0x00, 0xD9, 0xDA, rng.randrange(256)])])
        elif kind == 4:
            del m[at: at + rng.randint(1, 16)]
        elif kind == 5 and segs:  # a segment's length rewritten
            off = rng.choice(segs)[0]
            m[off + 2: off + 4] = struct.pack(">H", rng.choice([0, 1, 2, 3, rng.randrange(65536)]))
        elif kind == 6 and segs:  # a segment dropped or doubled
            off, _, length = rng.choice(segs[:-1] or segs)
            seg = m[off: off + 2 + length]
            m[off: off + 2 + length] = seg + seg if rng.random() < 0.5 else b""
        elif kind == 7:  # the file cut and EOI appended, or EOI inserted inside the scan
            m = m[:at] + b"\xff\xd9"
        else:  # a marker byte inside the scan
            at = rng.randrange(header_end, len(m)) if header_end < len(m) else at
            m[at: at + 2] = bytes([0xFF, rng.randrange(256)])
        yield bytes(m)


def test_whatever_whole_accepts_pillow_decodes(corpus):
    rng = random.Random(2024)
    accepted = refused = 0
    for name, (data, _) in corpus.items():
        for m in mutants(data, rng, 700):
            if whole(m):
                accepted += 1
                assert pillow_decodes(m), f"{name}: whole() accepted a mutant Pillow refuses: {m[:64]!r}..."
            else:
                refused += 1
    # both sides reached: the property is not vacuous
    assert accepted > 1000 and refused > 1000


def test_whole_never_raises_on_noise():
    rng = random.Random(7)
    for _ in range(2000):
        noise = b"\xff\xd8" + bytes(rng.randrange(256) for _ in range(rng.randrange(0, 80)))
        assert whole(noise) in (True, False)


def test_check_image_still_refuses_what_pillow_refuses(corpus):
    """The conversion's check: a structurally whole file passes without a decode, anything
    else is decoded and refused as before (with Pillow's reason)."""
    rng = random.Random(5)
    for name, (data, _) in corpus.items():
        check_image(data)
        for m in mutants(data, rng, 150):
            ok = pillow_decodes(m)
            try:
                check_image(m)
                passed = True
            except BadInputError:
                passed = False
            if passed and not ok:
                pytest.fail(f"{name}: check_image passed a file Pillow cannot decode")


def test_what_pillows_header_parser_refuses_is_refused_by_check_image(corpus):
    """whole() reads what libjpeg decodes; Pillow's own parser also refuses short JFIF, Adobe and
    ICC segments. check_image opens with Pillow first, so those are refused all the same."""
    data, _ = corpus["baseline 4:2:0"]
    for body in (b"JFIF", b"Adobe", b"ICC_PROFILE\0"):
        m = data[:2] + b"\xff" + (b"\xe0" if body == b"JFIF" else b"\xee" if body == b"Adobe" else b"\xe2") \
            + struct.pack(">H", 2 + len(body)) + body + data[2:]
        assert whole(m) and not pillow_decodes(m)
        with pytest.raises(BadInputError):
            check_image(m)


def test_any_exception_a_pillow_plugin_raises_is_a_bad_input(tmp_path):
    """Pillow's plugins raise NotImplementedError, RuntimeError, OverflowError, AttributeError...
    on hostile files: a one-line skip at conversion, never a failed conversion."""
    from dsconvert import convert

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "DDS")
    dds = bytearray(buf.getvalue())
    dds[80:84] = bytes(4)  # the pixel format's flags: Pillow raises NotImplementedError
    with pytest.raises(BadInputError, match="NotImplementedError"):
        check_image(bytes(dds))
    good = io.BytesIO()
    Image.new("RGB", (16, 16), (9, 9, 9)).save(good, "JPEG")
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "bad.jpg").write_bytes(bytes(dds))
    (tmp_path / "src" / "a" / "good.jpg").write_bytes(good.getvalue())
    for extra in ({}, {"max_size": 8}):
        m = convert(str(tmp_path / "src"), str(tmp_path / f"out{len(extra)}"), **extra).manifest
        assert m.num_samples == 1 and [s["path"] for s in m.skipped] == ["a/bad.jpg"]


# --- top_rows: a frame cut below the rows a crop reads ------------------------------------


def turbo():
    """The libjpeg-turbo binding's FastJpeg (the cut decode needs its stop-at-first-warning)."""
    pytest.importorskip("turbojpeg", reason="PyTurboJPEG is not installed (pip install 'dsconvert[fused]')")
    from dsconvert.codecs import jpeg_decoders

    fast = dict(jpeg_decoders()).get("turbojpeg")
    if fast is None:
        pytest.skip("libturbojpeg does not load here")
    return fast


@pytest.fixture(scope="module")
def cut_corpus(photos):
    """Every chroma sampling Pillow writes, odd sizes, and a size where 1/8 scaling applies."""
    rgb = photos["astronaut"].convert("RGB").resize((301, 229))
    return {
        "4:4:4": encode(rgb, quality=90, subsampling=0),
        "4:2:2": encode(rgb, quality=90, subsampling=1),
        "4:2:0": encode(rgb, quality=90, subsampling=2),
        "grayscale": encode(photos["camera"].convert("L").resize((257, 203)), quality=90),
        "4:2:0 large": encode(photos["coffee"].convert("RGB").resize((1037, 779)), quality=85),
    }


def pixels_of(data: bytes):
    import numpy as np

    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("name", ["4:4:4", "4:2:2", "4:2:0", "grayscale", "4:2:0 large"])
def test_a_cut_frame_decodes_the_top_rows_pixel_for_pixel(cut_corpus, name):
    """Through Pillow at full scale and libjpeg-turbo at 1/1..1/8: the rows above the cut are
    exactly the whole image's (the chroma row below the last one included), for every cut."""
    import numpy as np

    from dsconvert.jpeg_structure import top_rows

    data = cut_corpus[name]
    full = pixels_of(data)
    height = full.shape[0]
    fast = turbo()
    scaled = {k: np.asarray(fast.reduced(data, k)) for k in (1, 2, 4, 8)}
    cuts = 0
    for rows in range(1, height, 3 if height < 300 else 17):
        cut = top_rows(data, rows)
        if cut is None:  # only where no MCU row would be saved
            assert rows > height - 2 * 16 - 4, rows
            continue
        assert len(cut) == len(data) and whole(cut)
        part = pixels_of(cut)
        assert rows < part.shape[0] < height and np.array_equal(part[:rows], full[:rows]), rows
        for k, ref in scaled.items():
            out = np.asarray(fast.cut(cut, k))
            need = -(-rows // k)
            assert np.array_equal(out[:need], ref[:need]), (rows, k)
        cuts += 1
    assert cuts > 10


def test_frames_that_cannot_be_cut_are_left_alone(corpus, cut_corpus):
    """Progressive (several passes over every row), restart markers, a cut at or past the
    last MCU row, anything that is not a JPEG: None, and the caller decodes in full."""
    from dsconvert.jpeg_structure import top_rows

    assert top_rows(corpus["progressive"][0], 8) is None
    assert top_rows(corpus["restart markers"][0], 8) is None
    assert top_rows(corpus["cmyk"][0], 8) is not None  # the caller refuses CMYK before it cuts
    data = cut_corpus["4:2:0"]  # 229 rows: 15 MCU rows of 16
    assert top_rows(data, 200) is not None and top_rows(data, 222) is None
    for rows in (229, 5000, 0, -3):
        assert top_rows(data, rows) is None
    for junk in (b"", b"\xff\xd8", b"GIF89a", data[:100], b"\xff\xd8\xff\xc0\x00\x11"):
        assert top_rows(junk, 8) is None


def test_a_cut_decode_accepts_only_what_pillow_decodes_and_gives_its_rows(corpus, cut_corpus):
    """Thousands of mutants (truncated, bytes replaced, markers inserted, segments dropped):
    whenever the cut decode returns pixels, Pillow decodes the whole file without error and
    its top rows are those pixels. Damage below the cut that Pillow refuses (a truncated file)
    is still refused: the file ends before the marker the cut decode must find."""
    import numpy as np

    from dsconvert.codecs import FastJpeg, fast_decode

    turbo_fast = turbo()
    served = []

    def cut(data: bytes, k: int):
        out = turbo_fast.cut(data, k)
        served.append(True)
        return out

    fast = FastJpeg("turbojpeg", turbo_fast.header, turbo_fast.decode, turbo_fast.reduced, turbo_fast.eighths, cut)
    rng = random.Random(11)
    cut_ok = refused = 0
    for name, data in list(cut_corpus.items())[:4] + [("optimized tables", corpus["optimized tables"][0])]:
        for m in mutants(data, rng, 400):
            rows = rng.randrange(1, 120)
            served.clear()
            got = fast_decode(m, fast, rows=lambda height, width, k, rows=rows: rows)
            if got is None:
                refused += 1
                continue
            if not served:
                continue  # not cut: the whole-file path, tested elsewhere
            pixels, _ = got
            assert pillow_decodes(m), f"{name}: a cut decode accepted what Pillow refuses: {m[:64]!r}"
            assert np.array_equal(pixels[:rows], pixels_of(m)[:rows]), name
            cut_ok += 1
    assert cut_ok > 200 and refused > 200


def test_a_truncated_file_is_refused_wherever_the_cut_falls(cut_corpus):
    from dsconvert.codecs import fast_decode

    fast = turbo()
    data = cut_corpus["4:2:0 large"]
    for keep in (0.3, 0.6, 0.9, 0.99):
        m = data[: int(len(data) * keep)]
        assert not pillow_decodes(m)
        for rows in (1, 17, 200, 700):
            assert fast_decode(m, fast, rows=lambda height, width, k, rows=rows: rows) is None, (keep, rows)


class _Counting:
    """The checks' header memo, counting its hits (or, ``off``, never used)."""

    def __init__(self, off: bool = False):
        from dsconvert.codecs.checks import _KnownHeads
        self.memo, self.off, self.hits = _KnownHeads(), off, 0

    def known_whole(self, data):
        if self.off:
            return False
        found = self.memo.known_whole(data)
        self.hits += found
        return found

    def learn(self, data, start, opened):
        if not self.off:
            self.memo.learn(data, start, opened)


def _verdict(data, max_pixels=None):
    try:
        check_image(data, max_pixels)
        return "passed"
    except BadInputError as exc:
        return exc.reason


def test_a_known_header_changes_no_verdict(corpus, monkeypatch):
    """check_image remembers the headers of JPEGs that passed and then only checks the rest of a
    file that starts with one: every mutant (truncated, bytes flipped in the scan or the header,
    EOI moved, markers inserted) gets the verdict it gets with no memory, and the memory is used."""
    import dsconvert.codecs.checks as checks

    rng = random.Random(11)
    cases = [(name, m) for name, (data, _) in corpus.items() for m in [data, *mutants(data, rng, 120)]]
    monkeypatch.setattr(checks, "_WHOLE_HEADS", _Counting(off=True))
    without = [_verdict(m) for _, m in cases]
    memo = _Counting()
    monkeypatch.setattr(checks, "_WHOLE_HEADS", memo)
    for data, _ in corpus.values():
        _verdict(data)  # the intact files' headers learned
    with_memo = [_verdict(m) for _, m in cases]
    for (name, m), a, b in zip(cases, without, with_memo):
        assert a == b, f"{name}: {a!r} without the memo, {b!r} with it: {m[:80]!r}"
    assert memo.hits > 100 and "passed" in with_memo and len(set(with_memo)) > 2


def test_a_known_header_is_still_held_to_the_pixel_limit(corpus, monkeypatch):
    import dsconvert.codecs.checks as checks

    monkeypatch.setattr(checks, "_WHOLE_HEADS", _Counting())
    data, _ = corpus["baseline 4:2:0"]  # 120 x 90
    assert _verdict(data) == "passed" and checks._WHOLE_HEADS.memo.heads
    assert "exceeds the limit of 100" in _verdict(data, max_pixels=100)
    assert _verdict(data) == "passed" and checks._WHOLE_HEADS.hits == 1
