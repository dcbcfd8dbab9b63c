"""Skipped inputs as the manifest and shard records list them: one entry per input, except
that a run of consecutive rows of one container skipped for one reason is one entry with a
``count`` (``a.parquet/rows 12-1999999``).

Rows are compacted only where the inputs are rows (``ROW_KINDS``): a folder may hold files
named ``row 1`` and ``row 2``, which stay two entries.

Why: a 100 kB Parquet file may declare two million null rows; listed one by one they made a
712 MB manifest and took minutes. Compacted, the work and the listing are bounded by the runs
(the distinct reasons and places), while the accounting still counts every input:
``files_seen == files_written + sum(count)``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

__all__ = ["compact", "count_of", "total", "row_run", "InputSet"]

ROW_KINDS = ("parquet",)  # source kinds whose inputs are rows: "FILE/row N"
_ROWS = re.compile(r"^(?P<where>.*)/rows? (?P<first>\d+)(?:-(?P<last>\d+))?$")


def count_of(entry: Dict[str, Any]) -> int:
    """How many inputs one ``{path, reason[, count]}`` entry stands for."""
    return int(entry.get("count", 1))


def total(entries: Iterable[Dict[str, Any]]) -> int:
    """How many inputs a list of entries stands for."""
    return sum(count_of(e) for e in entries)


def row_run(where: str, first: int, last: int) -> str:
    """The path of rows ``first..last`` of the container ``where``."""
    return f"{where}/row {first}" if first == last else f"{where}/rows {first}-{last}"


def _rows_of(entry: Dict[str, Any]) -> Optional[Tuple[str, int, int]]:
    """(container, first, last) when the entry names a row or a run of rows whose count
    matches; None for any other input."""
    m = _ROWS.match(entry["path"])
    if m is None:
        return None
    first = int(m["first"])
    last = int(m["last"]) if m["last"] is not None else first
    if last < first or last - first + 1 != count_of(entry):
        return None
    return m["where"], first, last


def compact(entries: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Entries in the same order, each run of adjacent entries naming consecutive rows of one
    container with one reason merged into one entry with its ``count``. Nothing else changes."""
    out: List[Dict[str, Any]] = []
    last: Optional[Tuple[str, int, int]] = None
    for entry in entries:
        rows = _rows_of(entry)
        if (rows is not None and last is not None and out and rows[0] == last[0] and rows[1] == last[2] + 1
                and entry["reason"] == out[-1]["reason"]):
            first = last[1]
            last = (rows[0], first, rows[2])
            n = rows[2] - first + 1
            out[-1] = {"path": row_run(rows[0], first, rows[2]), "reason": entry["reason"], "count": n}
            continue
        out.append({"path": entry["path"], "reason": entry["reason"],
                    **({"count": count_of(entry)} if count_of(entry) != 1 else {})})
        last = rows
    return out


class InputSet:
    """A set of input paths where runs of rows stay runs: ``verify --source`` compares what an
    output accounts for with today's scan in work bounded by the entries, not by the rows a
    run stands for."""

    def __init__(self, rows: bool = True) -> None:
        self.runs = rows  # whether "X/row N" paths name rows (a Parquet source) or plain files
        self.plain: set = set()
        self.rows: Dict[str, List[Tuple[int, int]]] = {}

    def add(self, path: str, count: int = 1) -> None:
        rows = _rows_of({"path": path, "count": count}) if self.runs else None
        if rows is None:
            self.plain.add(path)
        else:
            self.rows.setdefault(rows[0], []).append((rows[1], rows[2]))

    def _merged(self) -> Dict[str, List[Tuple[int, int]]]:
        out = {}
        for where, runs in self.rows.items():
            merged: List[Tuple[int, int]] = []
            for first, last in sorted(runs):
                if merged and first <= merged[-1][1] + 1:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], last))
                else:
                    merged.append((first, last))
            out[where] = merged
        return out

    def __len__(self) -> int:
        return len(self.plain) + sum(last - first + 1 for runs in self._merged().values() for first, last in runs)

    def __contains__(self, path: str) -> bool:
        rows = _rows_of({"path": path}) if self.runs else None
        if rows is None:
            return path in self.plain
        return any(first <= rows[1] <= last for first, last in self._merged().get(rows[0], []))

    def minus(self, other: InputSet) -> List[str]:
        """The paths (runs as runs) of this set that ``other`` lacks, sorted."""
        out = sorted(self.plain - other.plain)
        theirs = other._merged()
        for where, runs in sorted(self._merged().items()):
            holes, h = theirs.get(where, []), 0  # both sorted and disjoint: one sweep
            for first, last in runs:
                while h < len(holes) and holes[h][1] < first:
                    h += 1
                at, k = first, h
                while k < len(holes) and holes[k][0] <= last:
                    if holes[k][0] > at:
                        out.append(row_run(where, at, holes[k][0] - 1))
                    at = max(at, holes[k][1] + 1)
                    k += 1
                if at <= last:
                    out.append(row_run(where, at, last))
        return out
