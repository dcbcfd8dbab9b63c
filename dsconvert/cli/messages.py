"""Errors as one line: every exception the CLI meets becomes ``dsconvert: error: ...`` and an
exit status; streams that cannot encode a name or whose reader has gone are handled here."""

from __future__ import annotations

import contextlib
import io
import os
import re
import select
import sys
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Iterator, List

from ..errors import DsconvertError

__all__ = ["message", "one_line", "errors_as_messages", "tolerant_streams", "pipe_closed", "silence", "exit_status"]

_STORAGE_LIBRARIES = ("botocore", "aiobotocore", "aiohttp", "s3fs", "gcsfs", "adlfs", "fsspec", "google")


def _storage_error(exc: BaseException) -> bool:
    """An error from a remote storage client (no endpoint, no credentials, access denied...)."""
    return type(exc).__module__.split(".")[0] in _STORAGE_LIBRARIES or isinstance(exc, PermissionError)


def _os_message(exc: OSError) -> str:
    """'permission denied: /data/x': what the system said, and about which path."""
    what = exc.strerror or str(exc) or type(exc).__name__
    what = what[:1].lower() + what[1:]
    names = [os.fsdecode(n) if isinstance(n, bytes) else str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{what}: {' -> '.join(names)}" if names else what


def message(exc: BaseException) -> str:
    """The one line that stands for ``exc``: every error the CLI can meet, named."""
    if isinstance(exc, DsconvertError):
        return str(exc)
    if isinstance(exc, BrokenProcessPool):
        return ("a worker process died unexpectedly (killed, out of memory, or a crash in a native library); "
                "run the same command again (a conversion resumes where it stopped)")
    if isinstance(exc, OSError) and exc.filename is not None and type(exc).__module__ == "builtins":
        return _os_message(exc)  # a local file: its path says more than a storage hint
    if _storage_error(exc):
        return (f"storage: {type(exc).__name__}: {exc} (check the URL, the credentials and --storage-option, "
                "e.g. client_kwargs.endpoint_url=...)")
    if isinstance(exc, OSError):
        return _os_message(exc)
    if isinstance(exc, MemoryError):
        return "out of memory"
    detail = f": {exc}" if str(exc) else ""
    return f"internal error: {type(exc).__name__}{detail} (set DSCONVERT_DEBUG=1 to see where; please report it)"


_LINE_BREAKS = re.compile(r"\s*[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+\s*")  # what splitlines() splits at


def one_line(text: str) -> str:
    """Messages quote paths and library errors, which may hold line breaks."""
    return _LINE_BREAKS.sub(" ", text).strip()


@contextlib.contextmanager
def errors_as_messages() -> Iterator[None]:
    """Every exception becomes ``dsconvert: error: ...`` on one line and exit status 1 (with
    DSCONVERT_DEBUG set, unexpected ones keep their traceback). A broken pipe is main's."""
    try:
        yield
    except BrokenPipeError:
        raise
    except Exception as exc:
        if os.environ.get("DSCONVERT_DEBUG") and not isinstance(exc, DsconvertError):
            raise
        red = "\033[31m" if sys.stderr.isatty() and not os.environ.get("NO_COLOR") else ""
        reset = "\033[0m" if red else ""
        print(f"{red}dsconvert: error:{reset} {one_line(message(exc))}", file=sys.stderr)
        raise SystemExit(1) from None


@contextlib.contextmanager
def tolerant_streams() -> Iterator[None]:
    """Names with undecodable bytes (surrogate escapes) print as escapes instead of raising
    UnicodeEncodeError on a strict stdout (PYTHONIOENCODING=utf-8, some locales)."""
    changed = []
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            try:
                stream.reconfigure(errors="backslashreplace")
                changed.append(stream)
            except (ValueError, OSError):
                pass
    try:
        yield
    finally:
        for stream in changed:
            with contextlib.suppress(ValueError, OSError):
                stream.reconfigure(errors="strict")


def pipe_closed(stream: Any) -> bool:
    """Whether ``stream`` is a pipe whose reader has gone (``dsconvert info OUT | head -1``)."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def silence(streams: List[Any]) -> None:
    """Point the closed output at /dev/null, so the interpreter's last flush does not complain."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in streams:
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def exit_status(code: Any) -> int:
    """SystemExit's code as a status: None is 0, a message is printed and is 1."""
    if code is None or isinstance(code, int):
        return int(code or 0)
    print(f"dsconvert: error: {one_line(str(code))}", file=sys.stderr)
    return 1
