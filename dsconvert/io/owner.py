"""What a conversion can prove it wrote into its output, so that cleaning up never removes or
replaces a file it did not write (a user's ``shard-000099.tar`` is named like a shard, a user's
``.shard-000000.tar.1.tmp`` like a temporary file).

``OUT/.dsconvert.owner`` is made once, when a conversion first claims the folder: its first
line holds a random token. Every writer appends a line ``TOKEN BYTES SHA256 NAME`` just
before it moves a file into place (a shard, its record, a samples table): a file is *ours*
when a line with this output's token names it with its present size and sha256. Records and
shards stay byte-identical between runs: the proof lives beside them, not in them.

Temporary files (``.NAME.RANDOM.tmp``, :func:`dsconvert.io.localfs.atomic_write`) are proved
the same way: a line ``TOKEN temp NAME`` is appended *before* the file is made, and the file is
then created exclusively (``O_EXCL``, never through a link), so a journalled temporary name
is one this output made, or nothing; a kill at any point leaves either no file or a proved
one. Journalling beside the target keeps every write one rename within the folder and every
proof in one file (a private temp folder would need a proof of its own, and h5py writes
through a path that must stay beside the target).

Locally lines are appended with ``O_APPEND`` (one ``write`` each: whole lines from any number
of processes; each starts with a newline, so a line cut short by a kill spoils only itself).
Object stores have no append: each line is an object of its own, ``.dsconvert.owned.<sha>``
(and temporary files are staged outside the output). The journal is a control file: it is
never opened through a symlink (a copy made with ``cp -rs`` would append to the original's).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import stat
from typing import Callable, Dict, Optional, Set, Tuple

from ..errors import OutputExistsError
from .localfs import open_regular, stream_sha256, temp_name
from .location import Location

__all__ = ["OWNER_NAME", "LOCK_NAME", "owner_token", "note", "note_temp", "temp_noter", "Owned"]

OWNER_NAME = ".dsconvert.owner"
LOCK_NAME = ".dsconvert.lock"  # held (io.locks, process=True) while a conversion writes; kept after
_LINE_OBJECT = ".dsconvert.owned."  # + the line's sha256 (object stores)
_HEADER = "dsconvert-owner"
_TOKEN = re.compile(r"[0-9a-f]{32}")
_LINE = re.compile(r"([0-9a-f]{32}) (\d{1,20}) ([0-9a-f]{64}) ([A-Za-z0-9_.][A-Za-z0-9_.-]{0,254})")
_TEMP_WORD = "temp"
_TEMP_LINE = re.compile(rf"([0-9a-f]{{32}}) {_TEMP_WORD} (\.[A-Za-z0-9_.-]{{1,254}}\.tmp)")
_HEAD_BYTES = 4096


def _read_token(out: Location) -> Optional[str]:
    try:
        if out.remote:
            head = out.read_range(OWNER_NAME, 0, _HEAD_BYTES)
        else:
            with open_regular(out.path(OWNER_NAME), follow=False) as f:
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
    tmp = out.path(temp_name(OWNER_NAME))  # not journalled (there is no journal yet): never removed by cleanup
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        try:
            os.write(fd, header)
        finally:
            os.close(fd)
        os.link(tmp, path)  # never follows or replaces what is at path (a link there stays a link)
    except FileExistsError:  # another conversion made it first, or a damaged one is there
        token = _read_token(out)
        if token is None:  # damaged (not ours to judge): replaced, its proofs were unreadable anyway
            if not stat.S_ISREG(os.lstat(path).st_mode):
                raise _not_regular(path) from None
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


def _not_regular(path: str) -> OutputExistsError:
    return OutputExistsError(f"{path} is a symbolic link or not a regular file: dsconvert never follows its owner "
                             "journal; remove it, or choose another folder", path)


def _append(out: Location, line: str) -> None:
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK  # a FIFO: no wait
        fd = os.open(out.path(OWNER_NAME), flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _not_regular(out.path(OWNER_NAME)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _not_regular(out.path(OWNER_NAME))
        os.write(fd, ("\n" + line).encode("ascii"))
    finally:
        os.close(fd)


def note(out: Location, token: str, name: str, nbytes: int, sha256: str) -> None:
    """Record that ``name`` (``nbytes``, ``sha256``) is this output's, before it is moved in."""
    line = f"{token} {nbytes} {sha256} {name}"
    if out.remote:
        out.write_bytes(_LINE_OBJECT + hashlib.sha256(line.encode()).hexdigest()[:40], line.encode("ascii"))
        return
    _append(out, line)


def note_temp(out: Location, token: str, name: str) -> None:
    """Record that the temporary file ``name`` is this output's, before it is made."""
    line = f"{token} {_TEMP_WORD} {name}"
    if out.remote:  # temporary files are staged outside an object store's output
        return
    _append(out, line)


def temp_noter(out: Location, token: str) -> Optional[Callable[[str], None]]:
    """What :meth:`Location.write` calls with a temporary name before making it: the note of
    this output's token (None without one: nothing journalled, so nothing ever removed)."""
    if not token or out.remote:
        return None
    return lambda name: note_temp(out, token, name)


class Owned:
    """The files this output's token proves ours, read once (lazily)."""

    def __init__(self, out: Location, token: str):
        self.out = out
        self.token = token
        self._claims: Optional[Dict[str, Set[Tuple[int, str]]]] = None
        self._temps: Set[str] = set()

    @property
    def claims(self) -> Dict[str, Set[Tuple[int, str]]]:
        """name -> the (bytes, sha256) it was written with, by this output's writers."""
        if self._claims is None:
            claims: Dict[str, Set[Tuple[int, str]]] = {}
            for line in self._lines():
                line = line.strip()
                m = _LINE.fullmatch(line)
                if m and m.group(1) == self.token:
                    claims.setdefault(m.group(4), set()).add((int(m.group(2)), m.group(3)))
                t = _TEMP_LINE.fullmatch(line)
                if t and t.group(1) == self.token:
                    self._temps.add(t.group(2))
            self._claims = claims
        return self._claims

    @property
    def temps(self) -> Set[str]:
        """The temporary names this output's writers journalled before making them."""
        self.claims  # noqa: B018 - read once, with the claims
        return self._temps

    def proves_temp(self, name: str) -> bool:
        """Whether ``name`` is a temporary file this output made: journalled, and a regular
        file (not a link put in its place)."""
        if name not in self.temps or self.out.remote:
            return False
        try:
            return stat.S_ISREG(os.lstat(self.out.path(name)).st_mode)
        except OSError:
            return False

    def _lines(self) -> list:
        if not self.out.remote:
            try:
                with open_regular(self.out.path(OWNER_NAME), follow=False) as f:
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
