"""Sample keys that survive tar, webdataset and every file name a user can have.

The webdataset reader splits a member name at the *first* dot of its basename into key and
field, so ``shot.v2.0001.jpg`` would become key ``shot`` with field ``v2.0001.jpg``. We
therefore percent-encode the key's basename so that it holds no dot, and encode anything
else that is not safe in a tar member name or in JSON:

* ``%``, ``.`` (basename only), ``~`` and ``\\`` and control characters become ``%XX``;
* bytes that are not valid UTF-8 (file names are bytes on POSIX; Python hands them to us
  as surrogate escapes) become ``%XX`` of the raw byte;
* everything else, spaces and unicode included, stays readable.

The encoding is injective and ``decode_key`` inverts it, so the original relative path
(without its extension) is always recoverable from the key. A raw ``~`` never appears in an
encoded string, which leaves it free as the separator of :func:`disambiguate`.
"""

from __future__ import annotations

import re

__all__ = ["encode_key", "decode_key", "disambiguate", "escape_path", "unescape_path", "is_utf8"]

_ALWAYS = frozenset("%~\\")
_SEPARATOR = "~"


# what _escape changes, per ``extra``: a text with none of it is returned as it is (one regex
# search instead of a Python loop over its characters: the scan encodes every key)
_TO_ESCAPE = {extra: re.compile("[%~\\\\\x00-\x1f\x7f\udc80-\udcff" + re.escape("".join(sorted(extra))) + "]")
              for extra in (frozenset(), frozenset("."))}


def _escape(text: str, extra: frozenset) -> str:
    pattern = _TO_ESCAPE.get(extra)
    if pattern is not None and pattern.search(text) is None:
        return text
    out = []
    for ch in text:
        code = ord(ch)
        if ch in _ALWAYS or ch in extra or code < 0x20 or code == 0x7F:
            out.append(f"%{code:02X}")
        elif 0xDC80 <= code <= 0xDCFF:  # surrogate escape of an undecodable byte
            out.append(f"%{code - 0xDC00:02X}")
        else:
            out.append(ch)
    return "".join(out)


_HEX = frozenset("0123456789abcdefABCDEF")


def _unescape(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "%":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or not _HEX.issuperset(pair):
                raise ValueError(f"malformed %-escape at position {i} of {text!r}")
            raw.append(int(pair, 16))
            i += 3
        else:
            raw.extend(ch.encode("utf-8", "surrogateescape"))
            i += 1
    return raw.decode("utf-8", "surrogateescape")


def encode_key(stem: str) -> str:
    """Encode a relative path without extension (``a/b.c/shot.v2``) into a tar-safe key."""
    if not stem or stem.startswith("/") or stem.endswith("/"):
        raise ValueError(f"not a relative file stem: {stem!r}")
    head, _, base = stem.rpartition("/")
    parts = [_escape(p, frozenset()) for p in head.split("/")] if head else []
    parts.append(_escape(base, frozenset(".")))
    return "/".join(parts)


def decode_key(key: str) -> str:
    """The relative path stem a key was made from (inverse of :func:`encode_key`); ValueError
    for a malformed ``%`` escape."""
    if _SEPARATOR in key:
        key, _, ext = key.rpartition(_SEPARATOR)
        return f"{_unescape(key)}.{_unescape(ext)}"
    return _unescape(key)


def disambiguate(key: str, extension: str) -> str:
    """Key for one of several files that share a stem (``a.jpg``, ``a.png`` in one class).

    Appends the encoded extension after a raw ``~``, which no encoded key contains, so the
    result cannot collide with any other key; ``decode_key`` gives back ``a.jpg``.
    """
    return f"{key}{_SEPARATOR}{_escape(extension, frozenset('.'))}"


def escape_path(path: str) -> str:
    """A relative path as strict-JSON-safe text: only ``%`` and undecodable bytes escaped."""
    if path.isascii() and "%" not in path:  # nothing to escape (no surrogates either): the common case
        return path
    out = []
    for ch in path:
        code = ord(ch)
        if ch == "%":
            out.append("%25")
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"%{code - 0xDC00:02X}")
        else:
            out.append(ch)
    return "".join(out)


def unescape_path(text: str) -> str:
    """Inverse of :func:`escape_path`; the result opens the file with ``open()``. ValueError for
    a malformed ``%`` escape (text from a hand-edited or hostile manifest)."""
    return _unescape(text)


def is_utf8(text: str) -> bool:
    """Whether ``text`` encodes as UTF-8: False for a name with undecodable bytes (POSIX names
    are bytes; Python hands those over as lone surrogates, which no JSON or tar text holds)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
