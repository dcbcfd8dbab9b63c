"""Units for people: byte counts as ``df -H`` shows them. A ground-floor module (standard
library only) that reports, the CLI and size estimates share."""

from __future__ import annotations

__all__ = ["format_size"]


def format_size(n: float) -> str:
    """1234567 -> '1.2 MB' (decimal units, as disks are sold and ``df -H`` shows)."""
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("kB", "MB", "GB", "TB", "PB"):
        n /= 1000
        if n < 1000 or unit == "PB":
            break
    return f"{n:.1f} {unit}"
