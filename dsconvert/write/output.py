"""An output folder's life cycle, the same for every writer (``convert``, ``Writer``,
``optimize``): claimed (a folder of someone else's files is refused), locked against a second
writer, its owner journal read (what this output can prove it wrote), a finished output found
there reused or refused ("already holds" is said here only) or reopened, files in the way of a
planned shard refused, stale shards removed, and the manifest saved last.

Why one place: every rule here protects a user's files (a ``shard-000007.tar`` of their own, a
symlinked control file, another finished output); written once, a new writer cannot forget one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import tempfile
from typing import Callable, Iterator, List, Optional, Type

from ..errors import DsconvertError, InsufficientSpaceError, OutputExistsError, OutputLockedError
from ..formats import Format, get
from ..io.localfs import free_bytes, mount_of
from ..io.location import Location
from ..io.locks import file_lock
from ..io.owner import LOCK_NAME, OWNER_NAME, Owned, owner_token, temp_noter
from ..manifest import MANIFEST_NAME, ORDER_NAME, Manifest
from ..plan import ShardResult, ShardSpec
from ..sizing import SizeEstimate, format_size

__all__ = ["Output", "open_output", "output_lock", "check_control_files", "claim_output", "remove_previous",
           "remove_stale", "adopt", "shard_files", "ForeignFiles", "check_space", "out_of_space_is_resumable",
           "is_out_of_space", "NEARLY_FULL"]

NEARLY_FULL = 1 << 20  # free bytes below which a dead writer most likely met a full disk


@contextlib.contextmanager
def output_lock(out_dir: str) -> Iterator[None]:
    """An exclusive lock on OUT/.dsconvert.lock: two conversions (or Writers) never share an
    output, in two processes or in one. A process lock (:func:`dsconvert.io.locks.file_lock`),
    so a killed conversion's lock dies with its main process, whatever its pool workers do;
    taken on the folder's resolved path and held by the lock file's identity, so that another
    spelling of the folder (a symlink to it) is the same lock."""
    path = os.path.join(os.path.realpath(out_dir), LOCK_NAME)
    check_control_files(out_dir)
    with contextlib.ExitStack() as stack:
        try:
            got = stack.enter_context(file_lock(path, wait=False, process=True))
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # a link put there since the check
                raise
            raise _linked_control_file(out_dir, LOCK_NAME) from None
        if not got:
            raise OutputLockedError(f"another dsconvert process (or another conversion or Writer in this one) "
                                    f"is writing into {out_dir}", path)
        yield


def _linked_control_file(out_dir: str, name: str) -> OutputExistsError:
    path = os.path.join(out_dir, name)
    return OutputExistsError(
        f"{path} is a symbolic link or not a regular file: dsconvert never follows its control files (lock, owner "
        f"journal), and a folder copied with links (cp -rs) is not an output of its own; remove {name} from "
        f"{out_dir} (and any other linked control file), or choose another folder", path)


def check_control_files(out_dir: str) -> None:
    """A local output whose lock file or owner journal is a link (or anything but a regular
    file) is refused: appending to it, or creating it, would write where the link points,
    outside the output (another output's journal, a file anywhere)."""
    for name in (LOCK_NAME, OWNER_NAME):
        try:
            st = os.lstat(os.path.join(out_dir, name))
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(st.st_mode):
            raise _linked_control_file(out_dir, name)


def claim_output(out: Location, overwrite: bool) -> None:
    """Refuse to write into a folder that holds files dsconvert did not write, unless
    ``overwrite``; then mark the folder as a dsconvert output (the lock file, kept after the
    run). Without this, a user's ``shard-000007.tar`` (webdataset's own naming) would be
    removed as a stale shard of an earlier plan."""
    # one listing, not an exists() check then a listing: a conversion started a moment earlier
    # makes its lock file (before any other) in between, and was taken for a foreign file
    if not out.remote:
        check_control_files(out.url)
    present = out.listdir()
    if MANIFEST_NAME in present or LOCK_NAME in present or OWNER_NAME in present:
        return
    if present and not overwrite:
        shown = ", ".join(repr(n) for n in present[:5]) + (f" and {len(present) - 5} more" if len(present) > 5 else "")
        raise OutputExistsError(
            f"{out.url} is not empty and is not a dsconvert output (it holds {shown}); choose a new or empty "
            "folder, or pass --overwrite to write into it (files named like dsconvert's shards are then replaced)",
            out.url)
    if out.remote:
        with out.write(LOCK_NAME) as f:  # object stores have no lock: the object marks the output as ours
            f.write(b"")


def remove_previous(out: Location, manifest: Manifest) -> None:
    """Remove a finished output's manifest (first), order file and every shard file it lists."""
    out.remove(MANIFEST_NAME)  # first: the output is unfinished from here on
    if manifest.order is not None:
        out.remove(ORDER_NAME)
    fmt = get(manifest.format)
    for entry in manifest.shards:
        for name in fmt.files_of(entry):
            out.remove(name)


def shard_files(prefix: str) -> str:
    """The pattern of the files a writer makes per shard: PREFIX-NNNNNN.<suffixes>."""
    return rf"{re.escape(prefix)}-\d{{6}}\.[a-z0-9.]+"


def remove_stale(out: Location, prefix: str, keep: set, owned: Owned) -> None:
    """Remove our shards and indexes that the current plan does not contain, and temp files
    left by killed writers (``.NAME.RANDOM.tmp``, see :func:`dsconvert.io.localfs.atomic_write`).
    Only files the owner journal proves ours: a user's file named like a shard, or like a
    temporary file, stays."""
    stale = re.compile(rf"^{shard_files(prefix)}$")
    for name in out.listdir():
        if owned.proves_temp(name) or (stale.match(name) and name not in keep and owned.proves(name)):
            out.remove(name)


def adopt(owned: Owned, manifest: Manifest) -> None:
    """Note a finished output's files as ours before its manifest goes (an output written
    before the owner journal existed has no other proof of them)."""
    for entry in manifest.shards:
        owned.add(entry.name, entry.bytes, entry.sha256)
        for name, part in entry.parts.items():
            owned.add(name, part["bytes"], part["sha256"])


class ForeignFiles:
    """The output's files before a run writes anything (one listing): a file already where a
    planned shard goes must be one this output wrote (a kill's leftover), else the run stops
    rather than replace it. Checked spec by spec, as specs come."""

    def __init__(self, owned: Owned):
        self.owned = owned
        self.present = set(owned.out.listdir())

    def refuse(self, fmt: Type[Format], spec: ShardSpec) -> None:
        """An OutputExistsError when a file of ``spec``'s shard is there and not provably ours."""
        out = self.owned.out
        for name in fmt.planned_files(spec.name):
            if name in self.present and not self.owned.proves(name):
                raise OutputExistsError(
                    f"{out.url_of(name)} is not a file this conversion wrote, and shard {spec.index} goes there: "
                    "move it away (or pass --overwrite to replace it) and run the same command again",
                    out.url_of(name))


def check_space(out_dir: str, prefix: str, needed: SizeEstimate, fmt: Type[Format]) -> None:
    """Refuse to start when the output cannot fit (shards already there count as written)."""
    shard = re.compile(rf"^{shard_files(prefix)}$")
    present = sum(os.path.getsize(os.path.join(out_dir, n)) for n in os.listdir(out_dir) if shard.match(n))
    free = free_bytes(out_dir)
    if needed.bytes - present > free:
        hint = " (--resize SHORT or --size HxW shrinks decoded caches)" if fmt.pixels != "never" else ""
        raise InsufficientSpaceError(
            f"the {fmt.id} output needs {needed.describe()} but {mount_of(out_dir)[0]} has "
            f"{format_size(free)} free; free some room, choose another --output{hint}, or pass --force",
            out_dir,
        )


_NO_SPACE_TEXT = re.compile(rf"No space left on device|Disk quota exceeded|errno = ({errno.ENOSPC}|{errno.EDQUOT})\b")


def is_out_of_space(exc: BaseException) -> bool:
    """ENOSPC or EDQUOT. h5py reports them as an OSError without errno, or (when a flush or
    close fails) as a RuntimeError, with libhdf5's text ``errno = 28`` in the message."""
    if isinstance(exc, DsconvertError) or not isinstance(exc, (OSError, RuntimeError)):
        return False
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return _NO_SPACE_TEXT.search(str(exc)) is not None


@contextlib.contextmanager
def out_of_space_is_resumable(out: Location) -> Iterator[None]:
    """A full disk mid-run is one clear error: what was written is complete (shards are
    renamed into place only when whole), and the same command resumes once there is room."""
    try:
        yield
    except (OSError, RuntimeError) as exc:
        if not is_out_of_space(exc):
            raise
        local = tempfile.gettempdir() if out.remote else out.url  # remote shards are staged locally
        point = mount_of(local)[0]
        raise InsufficientSpaceError(
            f"no space left on {point} ({format_size(free_bytes(local))} free) while writing {out.url}: "
            "finished shards are kept; free some room (or choose another --output) and run the same "
            "command again to resume", out.url) from None


class Output:
    """An output folder opened for writing (by :func:`open_output`): claimed, locked, and its
    owner journal's token read. ``overwrite_flag``: how the caller's user says overwrite
    (``--overwrite``, ``overwrite=True``), for the one error that names it."""

    def __init__(self, location: Location, overwrite: bool, overwrite_flag: str):
        self.location = location
        self.overwrite = overwrite
        self.overwrite_flag = overwrite_flag
        self.owned = Owned(location, owner_token(location))

    @property
    def guarded(self) -> Optional[Owned]:
        """The owner journal a run checks planned shards against (None under overwrite: a file
        in the way is replaced)."""
        return None if self.overwrite else self.owned

    def finished(self, what: str, reusable: Callable[[Manifest], bool] = lambda m: False) -> Optional[Manifest]:
        """The finished output already here, when ``reusable`` says it is what this run would
        write (returned: the caller keeps it); None when there is none, or under overwrite
        (then removed). Any other is refused: the folder "already holds a finished ``what``"."""
        if not self.location.exists(MANIFEST_NAME):
            return None
        previous = Manifest.load(self.location)
        if self.overwrite:
            remove_previous(self.location, previous)
            return None
        if reusable(previous):
            return previous
        raise OutputExistsError(f"{self.location.url} already holds a finished {what}; pass {self.overwrite_flag} "
                                "to replace it", self.location.url)

    def reopen(self, previous: Manifest) -> None:
        """Make a finished output unfinished again, to rewrite part of it: its files noted ours
        first (the manifest was their proof), then its manifest removed, so that a kill from the
        first rewritten shard on leaves no manifest describing shards that are gone."""
        if not self.overwrite:
            adopt(self.owned, previous)
        self.location.remove(MANIFEST_NAME)

    def remove_stale(self, fmt: Type[Format], prefix: str, results: List[ShardResult]) -> None:
        """Remove what an earlier run left that this one did not write (the journal read again:
        the writers added to it)."""
        keep = {name for r in results for name in fmt.files_of(r.entry)}
        remove_stale(self.location, prefix, keep, Owned(self.location, self.owned.token))

    def save(self, manifest: Manifest) -> None:
        """The manifest, last: the output is finished."""
        manifest.save(self.location, temp_noter(self.location, self.owned.token))


@contextlib.contextmanager
def open_output(location: Location, overwrite: bool, *, overwrite_flag: str = "overwrite=True",
                resumable: bool = True) -> Iterator[Output]:
    """Make, claim and (locally) lock the output at ``location`` for the ``with`` block.
    ``resumable``: a full disk inside the block is the one error that says the same command
    resumes (:func:`out_of_space_is_resumable`)."""
    location.makedirs()
    claim_output(location, overwrite)
    with contextlib.ExitStack() as stack:
        if not location.remote:
            stack.enter_context(output_lock(location.url))
        if resumable:
            stack.enter_context(out_of_space_is_resumable(location))
        yield Output(location, overwrite, overwrite_flag)
