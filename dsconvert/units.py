"""Sizes as people write them ('1GB', '512MiB') and as they read them ('1.2 MB', as ``df -H``
shows): a ground-floor module (standard library and errors only) that the CLI, reports and
size estimates share."""

from __future__ import annotations

import re
from fractions import Fraction

from .errors import OptionError

__all__ = ["parse_size", "format_size"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_size(text: str) -> int:
    """'1GB' -> 10**9, '512MiB' -> 2**29, '4096' -> 4096. An OptionError (a ValueError) for
    anything else; exact arithmetic, so no float rounding and no overflow on huge numbers."""
    m = _SIZE.match(str(text))
    if not m:
        raise OptionError(f"not a size: {text!r} (use e.g. 1GB, 512MiB, 1000000)")
    unit = (m.group(2) or "").lower().rstrip("b")
    return int(Fraction(m.group(1)) * _UNITS[unit])


def format_size(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as disks are sold and ``df -H`` shows)."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        n /= 1000
        if n < 1000 or unit == "PB":
            break
    return f"{n:.1f} {unit}"
