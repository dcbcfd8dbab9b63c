"""What a conversion can prove it wrote into its output, so that cleaning up never removes or
replaces a file it did not write (a user's ``shard-000099.tar`` is named like a shard).

``OUT/.dsconvert.owner`` is made once, when a conversion first claims the folder: its first
line holds a random token. Every writer appends a line ``TOKEN BYTES SHA256 NAME`` just
before it moves a file into place (a shard, its record, a samples table): a file is *ours*
when a line with this output's token names it with its present size and sha256. Records and
shards stay byte-identical between runs: the proof lives beside them, not in them.

Locally lines are appended with ``O_APPEND`` (one ``write`` each: whole lines from any number
of processes; each starts with a newline, so a line cut short by a kill spoils only itself).
Object stores have no append: each line is an object of its own, ``.dsconvert.owned.<sha>``.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from typing import Dict, Optional, Set, Tuple

from .localfs import open_regular, stream_sha256
from .location import Location

__all__ = ["OWNER_NAME", "LOCK_NAME", "owner_token", "note", "Owned"]

OWNER_NAME = ".dsconvert.owner"
LOCK_NAME = ".dsconvert.lock"  # held (io.locks, process=True) while a conversion writes; kept after
_LINE_OBJECT = ".dsconvert.owned."  # + the line's sha256 (object stores)
_HEADER = "dsconvert-owner"
_TOKEN = re.compile(r"[0-9a-f]{32}")
_LINE = re.compile(r"([0-9a-f]{32}) (\d{1,20}) ([0-9a-f]{64}) ([A-Za-z0-9_.][A-Za-z0-9_.-]{0,254})")
_HEAD_BYTES = 4096


def _read_token(out: Location) -> Optional[str]:
    try:
        if out.remote:
            head = out.read_range(OWNER_NAME, 0, _HEAD_BYTES)
        else:
            with open_regular(out.path(OWNER_NAME)) as f:
                head = f.read(_HEAD_BYTES)
    except (OSError, ValueError):
        return None
    first = head.split(b"\n", 1)[0].decode("ascii", "replace").split(" ")
    return first[1] if len(first) == 2 and first[0] == _HEADER and _TOKEN.fullmatch(first[1]) else None


def owner_token(out: Location) -> str:
    """This output's token: the one its owner file holds, or a new one written there first
    (a folder just claimed, or an output of a version before this file existed). Made with
    an exclusive link of a whole temp file: two conversions racing to make it agree on one."""
    token = _read_token(out)
    if token is not None:
        return token
    fresh = secrets.token_hex(16)
    header = f"{_HEADER} {fresh}\n".encode("ascii")
    if out.remote:
        out.write_bytes(OWNER_NAME, header)  # no exclusive create on object stores (nor a lock)
        return fresh
    path = out.path(OWNER_NAME)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(header)
        os.link(tmp, path)
    except FileExistsError:  # another conversion made it first, or a damaged one is there
        token = _read_token(out)
        if token is None:  # damaged (not ours to judge): replaced, its proofs were unreadable anyway
            os.replace(tmp, path)
            return fresh
        return token
    except OSError:  # a file system without hard links
        os.replace(tmp, path)
        return fresh
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    return fresh


def note(out: Location, token: str, name: str, nbytes: int, sha256: str) -> None:
    """Record that ``name`` (``nbytes``, ``sha256``) is this output's, before it is moved in."""
    line = f"{token} {nbytes} {sha256} {name}"
    if out.remote:
        out.write_bytes(_LINE_OBJECT + hashlib.sha256(line.encode()).hexdigest()[:40], line.encode("ascii"))
        return
    fd = os.open(out.path(OWNER_NAME), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, ("\n" + line).encode("ascii"))
    finally:
        os.close(fd)


class Owned:
    """The files this output's token proves ours, read once (lazily)."""

    def __init__(self, out: Location, token: str):
        self.out = out
        self.token = token
        self._claims: Optional[Dict[str, Set[Tuple[int, str]]]] = None

    @property
    def claims(self) -> Dict[str, Set[Tuple[int, str]]]:
        """name -> the (bytes, sha256) it was written with, by this output's writers."""
        if self._claims is None:
            claims: Dict[str, Set[Tuple[int, str]]] = {}
            for line in self._lines():
                m = _LINE.fullmatch(line.strip())
                if m and m.group(1) == self.token:
                    claims.setdefault(m.group(4), set()).add((int(m.group(2)), m.group(3)))
            self._claims = claims
        return self._claims

    def _lines(self) -> list:
        if not self.out.remote:
            try:
                with open_regular(self.out.path(OWNER_NAME)) as f:
                    return f.read().decode("ascii", "replace").split("\n")[1:]
            except OSError:
                return []
        lines = []
        for name in self.out.listdir():
            if name.startswith(_LINE_OBJECT):
                try:
                    lines.append(self.out.read_range(name, 0, 512).decode("ascii", "replace"))
                except OSError:
                    continue
        return lines

    def add(self, name: str, nbytes: int, sha256: str) -> None:
        """Note ``name`` as ours unless it is already (an older output's manifest adopted)."""
        if (nbytes, sha256) not in self.claims.get(name, set()):
            note(self.out, self.token, name, nbytes, sha256)
            self.claims.setdefault(name, set()).add((nbytes, sha256))

    def proves(self, name: str) -> bool:
        """Whether ``name`` is there as one of our writes left it: a size we wrote it with,
        then (only then: our own files are the only ones read) the sha256 of that write."""
        wrote = self.claims.get(name)
        if not wrote:
            return False
        try:
            size = self.out.size(name)
        except (OSError, ValueError):
            return False
        shas = {sha for n, sha in wrote if n == size}
        if not shas:
            return False
        try:
            with self.out.open(name) as f:
                return stream_sha256(f) in shas
        except (OSError, ValueError):
            return False
