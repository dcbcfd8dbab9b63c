"""One exception root for dsconvert (each subclass also derives from the matching builtin), and
the warnings it gives."""

from __future__ import annotations

from typing import Optional

__all__ = [
    "DsconvertError",
    "SourceError",
    "ManifestError",
    "OutputExistsError",
    "BadInputError",
    "MissingDependencyError",
    "OutputLockedError",
    "InsufficientSpaceError",
    "OptionError",
    "NotRegularFileError",
    "FusedFallbackWarning",
    "MissingExtensionWarning",
    "OfflineCacheWarning",
    "UpgradeWarning",
]


class DsconvertError(Exception):
    """Root of every error dsconvert raises on purpose. ``path`` names what it is about."""

    def __init__(self, message: str, path: Optional[str] = None):
        super().__init__(message)
        self.path = path
        self._init_args: tuple = (message, path)

    def __reduce__(self):  # keep ``path`` (and ``reason``) when raised in a worker process
        return (type(self), self._init_args)


class OptionError(DsconvertError, ValueError):
    """Options that do not go together (``--resize`` with ``--format wds``, say)."""


class SourceError(DsconvertError, ValueError):
    """The source cannot be scanned: missing, empty, or of an unknown layout."""


class ManifestError(DsconvertError, ValueError):
    """A manifest or shard index is missing, malformed, or of an unsupported version."""


class OutputExistsError(DsconvertError, FileExistsError):
    """The output already holds a (different) conversion; ``--overwrite`` replaces it."""


class OutputLockedError(DsconvertError, BlockingIOError):
    """Another conversion is writing into the same output directory."""


class InsufficientSpaceError(DsconvertError, OSError):
    """The output's file system has no room for the (estimated) output; ``--force`` overrides."""


class BadInputError(DsconvertError, ValueError):
    """One input file is unusable (empty, truncated, not an image, a decompression bomb...).

    Raised for the first bad input under ``strict``; otherwise the file is skipped and
    listed in the manifest with ``reason``.
    """

    def __init__(self, reason: str, path: Optional[str] = None):
        super().__init__(f"{path}: {reason}" if path else reason, path)
        self.reason = reason
        self._init_args = (reason, path)


class MissingDependencyError(DsconvertError, ImportError):
    """An optional dependency is needed; the message says what to install."""


class NotRegularFileError(DsconvertError, OSError):
    """A file an output names is a symlink to a device, a FIFO, a folder...: never opened, since
    reading ``/dev/zero`` never ends and opening a FIFO blocks."""


class MissingExtensionWarning(UserWarning):
    """One of dsconvert's optional C extensions did not build at install (no compiler, or no
    libjpeg headers): ``decode="fused"`` gives the same samples, slower. Said once per process,
    in one line naming the extension and the packages that build it."""


class FusedFallbackWarning(UserWarning):
    """``decode="fused"`` could not fold the transform's crop or resize into decoding: the
    dataset decodes whole images (the same samples, slower). Said once per dataset, naming the
    step that stopped it."""


class OfflineCacheWarning(UserWarning):
    """A remote output could not be reached and is read from ``cache_dir``: its manifest as last
    read from the remote, and every shard verified against it. Said once, naming the error."""


class UpgradeWarning(UserWarning):
    """An output written by an earlier dsconvert reads as before, but slower or in more memory
    than today's layout allows; said once per dataset, with the one command that upgrades it
    in place (``dsconvert upgrade OUT``)."""
