"""Is this JPEG whole? Answered from its markers, without decoding its pixels.

Verification at conversion used to decode every JPEG (at DCT scale 1/8): every entropy-coded
byte through the Huffman decoder, ~0.5 ms for a 40 kB photo, 5-10x the cost of writing it.
But what makes Pillow refuse a JPEG is structural: a truncated file (the entropy-coded data
runs off the end), a damaged or missing marker segment, a table libjpeg rejects before the
first pixel, a frame type or sampling it cannot decode. Corrupt entropy-coded *data* is only a
libjpeg warning, which Pillow ignores: it decodes such files, as before.

:func:`whole` looks at what libjpeg will decode; what Pillow's own header parser refuses (a
short JFIF/Adobe/ICC segment, a decompression bomb) is refused when the caller opens the file
with Pillow first, as ``check_image`` does. Its claim: if Pillow opens the file and ``whole``
is True, Pillow decodes it without error. It says True only for the common, fully checkable
case: one Huffman-coded frame (baseline or extended sequential), one scan holding every component, integral chroma
sampling, every quantisation table the frame names defined, every Huffman table valid as
libjpeg's ``jpeg_make_d_derived_tbl`` checks it, and the scan's entropy-coded data ending at
a marker, then EOI. Anything else (progressive files, several scans, arithmetic coding,
restart markers out of a scan, a marker it does not expect) returns False, and the caller
decodes as before. ``tests/test_jpeg_structure.py`` mutates real JPEGs thousands of ways and
checks that whatever this accepts and Pillow opens, Pillow decodes.
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List, Optional, Tuple

__all__ = ["whole", "whole_head", "scan_whole", "top_rows", "arithmetic"]

# the first marker after entropy-coded data: 0xFF followed by neither a stuffed zero, a
# restart marker, nor a fill byte
_SCAN_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_SEQUENTIAL_HUFFMAN = (0xC0, 0xC1)
_SKIPPED = frozenset(range(0xE0, 0xF0)) | {0xFE}  # APPn and COM: checked for length only


@functools.lru_cache(maxsize=256)  # most files carry the same few tables (libjpeg's standard ones)
def _huffman_table_ok(counts: bytes, values: bytes, dc: bool) -> bool:
    """libjpeg's checks on a DHT table (jpeg_make_d_derived_tbl): the code lengths fit a
    canonical code, and DC symbols are at most 15."""
    if sum(counts) != len(values) or len(values) > 256:
        return False
    code = 0
    for length, n in enumerate(counts, start=1):
        code += n
        if code >= (1 << length):  # no code may be all ones
            return False
        code <<= 1
    return not dc or all(v <= 15 for v in values)


_ARITHMETIC_FRAMES = frozenset((0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))  # SOF9-11, SOF13-15


def arithmetic(data: bytes) -> bool:
    """Whether the JPEG's frame is arithmetic-coded, from the marker segments before the first
    scan (never raises; False for anything else, a damaged header included). libjpeg decodes a
    truncated arithmetic scan as zeros without a warning, so no decoder can tell it from a
    whole one; and Pillow refuses whole ones past about 64 kB."""
    n = len(data)
    if data[:2] != b"\xff\xd8":
        return False
    pos = 2
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return False
        while pos < n and data[pos] == 0xFF:
            pos += 1
        if pos + 3 > n:
            return False
        marker = data[pos]
        if marker in _ARITHMETIC_FRAMES:
            return True
        if marker in (0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xDA, 0xD9):  # a Huffman frame, a scan, the end
            return False
        pos += 1 + ((data[pos + 1] << 8) | data[pos + 2])
    return False


def whole(data: bytes) -> bool:
    """True when ``data`` is a complete sequential Huffman-coded JPEG with one scan that libjpeg
    decodes without error; False when unsure (decode to find out). Never raises."""
    return scan_whole(data, whole_head(data))


def whole_head(data: bytes) -> int:
    """Where the scan's entropy-coded data starts (just past its SOS segment) when everything
    before it passes :func:`whole`'s checks, else -1. It reads nothing past that point: files
    that share these bytes share the answer. Never raises."""
    try:
        return _head(data)
    except (IndexError, ValueError):
        return -1


def scan_whole(data: bytes, start: int) -> bool:
    """The rest of :func:`whole` from ``start`` (:func:`whole_head`'s answer): the entropy-coded
    data ends at a marker, and that marker is EOI."""
    if start < 0:
        return False
    found = _SCAN_END.search(data, start)
    return found is not None and data[found.end() - 1] == 0xD9  # no end: truncated; another marker: a second scan


def _head(data: bytes) -> int:
    n = len(data)
    if data[:2] != b"\xff\xd8":
        return -1
    pos = 2
    frame: List[Tuple[int, int, int, int]] = []  # (component id, h, v, quant table)
    quant: Dict[int, bool] = {}
    huffman = {(0, 0), (0, 1), (1, 0), (1, 1)}  # (class, index): libjpeg-turbo supplies the standard 0 and 1
    while pos < n:
        if data[pos] != 0xFF:
            return -1
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            return -1
        marker = data[pos]
        pos += 1
        if marker in (0xD9, 0x00, 0x01, 0xD8) or 0xD0 <= marker <= 0xD7:
            return -1  # EOI before any scan, TEM, SOI again, a restart outside a scan
        if pos + 2 > n:
            return -1
        length = (data[pos] << 8) | data[pos + 1]
        if length < 2 or pos + length > n:
            return -1
        body = data[pos + 2: pos + length]
        pos += length
        if marker in _SKIPPED:
            continue
        if marker in _SEQUENTIAL_HUFFMAN:
            if frame or len(body) < 6 or body[0] != 8:  # 8-bit samples only
                return -1
            height, width, count = (body[1] << 8) | body[2], (body[3] << 8) | body[4], body[5]
            if not (0 < height <= 65500 and 0 < width <= 65500) or count not in (1, 3, 4) \
                    or len(body) != 6 + 3 * count:  # JPEG_MAX_DIMENSION, the components Pillow takes
                return -1
            for c in range(count):
                cid, hv, tq = body[6 + 3 * c: 9 + 3 * c]
                h, v = hv >> 4, hv & 15
                if not (1 <= h <= 4 and 1 <= v <= 4) or tq > 3:
                    return -1
                frame.append((cid, h, v, tq))
            max_h, max_v = max(c[1] for c in frame), max(c[2] for c in frame)
            if any(max_h % c[1] or max_v % c[2] for c in frame) or len({c[0] for c in frame}) != count:
                return -1  # fractional upsampling is not implemented in libjpeg; ids must differ
            if count > 1 and sum(c[1] * c[2] for c in frame) > 10:  # D_MAX_BLOCKS_IN_MCU
                return -1
            if count == 4:  # CMYK/YCCK: the Adobe marker decides the colour conversion; decode to know
                return -1
        elif marker == 0xDB:  # DQT: one or more tables
            i = 0
            while i < len(body):
                precision, tq = body[i] >> 4, body[i] & 15
                size = 64 * (2 if precision else 1)
                if precision > 1 or tq > 3 or i + 1 + size > len(body):
                    return -1
                quant[tq] = True
                i += 1 + size
        elif marker == 0xC4:  # DHT: one or more tables
            i = 0
            while i < len(body):
                tc, th = body[i] >> 4, body[i] & 15
                counts = body[i + 1: i + 17]
                if tc > 1 or th > 3 or len(counts) != 16:
                    return -1
                values = body[i + 17: i + 17 + sum(counts)]
                if not _huffman_table_ok(bytes(counts), bytes(values), tc == 0):  # bytes: hashable for the cache
                    return -1
                huffman.add((tc, th))
                i += 17 + sum(counts)
            if i != len(body):
                return -1
        elif marker == 0xDA:  # SOS: the one scan, with every component
            if not frame or any(c[3] not in quant for c in frame) or len(body) < 1:
                return -1
            count = body[0]
            if count != len(frame) or len(body) != 4 + 2 * count:
                return -1
            if {body[1 + 2 * c] for c in range(count)} != {c[0] for c in frame}:
                return -1
            for c in range(count):  # the DC and AC tables each component is coded with
                td, ta = body[2 + 2 * c] >> 4, body[2 + 2 * c] & 15
                if (0, td) not in huffman or (1, ta) not in huffman:
                    return -1
            ss, se, ahal = body[1 + 2 * count], body[2 + 2 * count], body[3 + 2 * count]
            if (ss, se, ahal) != (0, 63, 0):
                return -1
            return pos  # the entropy-coded data: scan_whole's
        elif marker == 0xDD:  # DRI
            if length != 4:
                return -1
        else:  # progressive, lossless or arithmetic frames, DAC, DNL, anything unexpected
            return -1
    return -1


def top_rows(data: bytes, rows: int) -> Optional[bytes]:
    """``data`` with its frame cut to just over ``rows`` rows: libjpeg decodes it only that far,
    the first ``rows`` rows (at any DCT scale, the first ``ceil(rows / k)``) pixel for pixel as
    in the whole image, then stops; the rest of the entropy-coded data is skipped unread, with
    one warning, "extraneous bytes before marker 0xd9". Entropy-coded data cannot be entered in
    the middle, so only rows below a crop are saved this way. None unless the file is sequential
    Huffman-coded, its first scan holds every component (one pass: nothing later depends on the
    rows cut), it has no restart markers, and the cut saves at least one MCU row. Never raises."""
    try:
        return _top_rows(data, rows)
    except (IndexError, ValueError):
        return None


def _top_rows(data: bytes, rows: int) -> Optional[bytes]:
    if data[:2] != b"\xff\xd8" or rows < 1:
        return None
    pos, n = 2, len(data)
    frame_at, height, count, max_v = -1, 0, 0, 0
    while pos + 4 <= n:
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        length = (data[pos + 2] << 8) | data[pos + 3]
        body = data[pos + 4: pos + 2 + length]
        if length < 2 or len(body) != length - 2:
            return None
        if marker in _SEQUENTIAL_HUFFMAN:
            if frame_at >= 0 or len(body) < 6:
                return None
            height, count = (body[1] << 8) | body[2], body[5]
            if count < 1 or len(body) != 6 + 3 * count:
                return None
            max_v = max(body[7 + 3 * c] & 15 for c in range(count))
            frame_at = pos + 5
        elif marker == 0xDA:  # the first scan: every component in it, or it is not the only pass
            if frame_at < 0 or not body or body[0] != count or not 1 <= max_v <= 4:
                return None
            # fancy chroma upsampling reads one chroma row below: keep 2 * max_v more rows
            mcu, cut = 8 * max_v, rows + 2 * max_v
            if height <= 0 or -(-cut // mcu) >= -(-height // mcu):
                return None  # a frame of unknown height (DNL), or no MCU row to save
            return data[:frame_at] + bytes(((cut >> 8) & 0xFF, cut & 0xFF)) + data[frame_at + 2:]
        elif marker == 0xDD or (0xC2 <= marker <= 0xCF and marker != 0xC4) \
                or marker in (0x01, 0xD8, 0xD9, 0xFF) or 0xD0 <= marker <= 0xD7:
            return None  # restart markers, other frame types, a marker out of place
        pos += 2 + length
    return None
