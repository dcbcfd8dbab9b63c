"""What several command handlers share: progress on stderr, the HTML report, checks of the
folders they are given, the skipped-inputs summary."""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from typing import Callable, List, Optional

from .. import skips
from ..errors import OptionError, SourceError
from ..io.location import is_remote
from ..manifest import Manifest

__all__ = ["stderr_log", "check_report_path", "write_report", "local_folder", "existing_output", "skip_summary"]


def stderr_log(args: argparse.Namespace) -> Optional[Callable[[str], None]]:
    """Progress lines on stderr, unless -q or --json (stdout then holds only the report)."""
    if args.quiet or getattr(args, "json", False):
        return None
    return lambda msg: print(msg, file=sys.stderr, flush=True)


def check_report_path(path: Optional[str]) -> None:
    """Refuse a --report path that cannot be written, before minutes of measuring, not after."""
    if path is None:
        return
    if os.path.isdir(path):
        raise OptionError(f"--report {path} is a folder; give a file name such as report.html", path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OptionError(f"--report {path}: {folder} is not an existing folder", path)
    from ..optional import require

    require("matplotlib", "the HTML report")  # its figures: said now, not after the measuring


def write_report(args: argparse.Namespace, renderer: str, report: dict) -> None:
    if not args.report:
        return
    from .. import html_report

    page = getattr(html_report, renderer)(report)
    # names with undecodable bytes (surrogate escapes) show as \udcXX, as on stderr; UTF-8 has no room for them
    page = page.encode("utf-8", "backslashreplace").decode("utf-8")
    path = html_report.write(args.report, page)
    if not args.quiet:
        print(f"report written to {path}", file=sys.stderr)


def local_folder(path: str, what: str) -> None:
    """Refuse an output folder that is a file, or lies inside one, naming it: makedirs' own
    error ('File exists', 'Not a directory') does not say which path is wrong."""
    if is_remote(path):
        return
    probe = os.path.abspath(path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if os.path.exists(probe) and not os.path.isdir(probe):
        where = "is a file" if probe == os.path.abspath(path) else f"is inside {probe}, which is a file"
        raise OptionError(f"{what} {path} {where}, not a folder", path)


def existing_output(path: str) -> None:
    """An OUT that does not exist, or is a file, said as such (not as a missing manifest)."""
    if is_remote(path) or path.endswith(".json"):
        return
    if not os.path.lexists(path):
        raise SourceError(f"{path} does not exist (expected a dsconvert output folder)", path)
    if not os.path.isdir(path):
        raise SourceError(f"{path} is a file, not a dsconvert output folder", path)


def skip_summary(manifest: Manifest, limit: int) -> List[str]:
    reasons: Counter = Counter()
    for s in manifest.skipped:  # an entry may be a run of rows (dsconvert.skips)
        reasons[s["reason"].split(":")[0]] += skips.count_of(s)
    lines = [f"skipped {skips.total(manifest.skipped)} input(s):"]
    lines += [f"  {n:>6}  {reason}" for reason, n in reasons.most_common()]
    for s in manifest.skipped[:limit]:
        lines.append(f"  {s['path']}: {s['reason']}")
    if len(manifest.skipped) > limit:
        lines.append(f"  ... ({skips.total(manifest.skipped[limit:])} more; `dsconvert info --skipped OUT`)")
    return lines
