"""One member at a time from ``tarfile``, safe against a header that would never let it move on.

``TarFile.next`` moves to the next header by the member's declared size rounded to blocks; a
negative size (a ``-`` in its octal field, or a PAX ``size=-5``) moves it back to the same
header, and Python 3.11's ``tarfile`` walks it forever (a scan, ``verify`` or an index of a
hostile tar hung). Every walk of a tar's headers goes through :func:`next_member`, which keeps
no ``TarInfo`` either (a tar may hold millions of members).
"""

from __future__ import annotations

import tarfile
from typing import Optional

__all__ = ["next_member"]


def next_member(tf: tarfile.TarFile) -> Optional[tarfile.TarInfo]:
    """``tf.next()``, none kept; a member declaring a negative size raises ``tarfile.ReadError``
    (nothing after it can be reached)."""
    m = tf.next()
    tf.members = []  # type: ignore[attr-defined]  # typeshed leaves it out
    if m is not None and m.size < 0:
        raise tarfile.ReadError(f"member {m.name!r} at byte {m.offset:,} declares a negative size ({m.size}): "
                                "nothing after it can be read")
    return m
