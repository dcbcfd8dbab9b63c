"""The diagnose report as a terminal page (colour only on a tty) or JSON.

JSON schema ``dsconvert.diagnose`` version 2 (1 had ``syscalls`` as the groups alone, no ``gpu``):

    schema, schema_version, duration_s, rate_hz, seconds
    target     {pid, cmdline, workers[], processes{pid: cmdline}}
    data       {files_seen, examples[], root, storage{kind, fstype, mount, latency_bound} | null}
    gpu        {available, backend (nvml | nvidia-smi | null), reason (why not, when not available),
                interval_s, job_gpus[index] (GPUs the job's processes hold; every GPU when none was
                found), gpus{index: {samples, mean_util, low_share (share of samples below 10 %),
                max_memory_mib}}, wait_share (the main thread's share of wall samples waiting for a
                batch, from the classification), comparison (one sentence)}
    syscalls   null | {tracer (perf | strace), seconds, groups{group: GROUP}, processes{pid: {group: GROUP
                       less histogram_us}}, lost_events (perf; null under strace),
                       block{permitted, reason (when not), scope, read_requests, read_bytes, completed,
                             ms{p50,p99} | null, max_ms, devices{"major:minor": {read_requests, read_bytes}}},
                       notes[]}
               GROUP = {count, bytes, ms{p50,p90,p99}, max_ms, mean_ms, over_10ms, histogram_us[{le, count}]}
               groups: open, file read, socket read, pipe read (and device/other read)
    diagnosis  {verdict (input-bound | compute-bound | unknown), bottleneck, summary, evidence[],
                commands[], notes[], main{category: {share, cpu_share, details{detail: share}}},
                workers{...same}, worker_busy_share, input_share, num_workers, samples{role: n},
                top_stacks[{role, category, detail, share, frames}],
                fixes[], bound_by, receive_share}

Added in version 1 (no field renamed): ``diagnosis.fixes`` lists every fix in the order to try
it, shell commands (each also in ``commands``, and runnable as printed) and code changes (each
also in ``notes``); ``diagnosis.bound_by`` is, for the ``no-workers`` bottleneck (a loop that
loads its own data), the category of that data work, else null; ``diagnosis.receive_share`` is
the training loop's share of time receiving batches from the workers (ipc, pin, collate).
``bottleneck`` may be ``no-workers`` besides the categories.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional

__all__ = ["render_text", "render_json"]


def render_json(report: Dict[str, Any]) -> str:
    return json.dumps(report, indent=1, default=str)


def _style(text: str, code: str, tty: bool) -> str:
    return f"\033[{code}m{text}\033[0m" if tty else text


def _table(title: str, table: Dict[str, Dict], add) -> None:
    add(f"{title:44s}{'wall':>7s}{'on CPU':>8s}")
    for category, entry in table.items():
        add(f"  {category:42s}{entry['share']:7.0%}{entry['cpu_share']:8.0%}")
        for detail, share in sorted(entry["details"].items(), key=lambda kv: -kv[1])[:4]:
            if share >= 0.01:
                add(f"    {detail[:40]:40s}{share:7.0%}")


def render_text(report: Dict[str, Any], tty: Optional[bool] = None) -> str:
    if tty is None:
        tty = sys.stdout.isatty()
    d = report["diagnosis"]
    t = report["target"]
    lines: List[str] = []
    add = lines.append
    cmd = t["cmdline"] if len(t["cmdline"]) <= 60 else t["cmdline"][:57] + "..."
    add(_style(f"dsconvert diagnose: pid {t['pid']} ({cmd}), {report['duration_s']:g} s at {report['rate_hz']} Hz, "
               f"{d['num_workers']} DataLoader worker(s)", "1", tty))
    colour = {"input-bound": "1;31", "compute-bound": "1;32"}.get(d["verdict"], "1")
    add(_style(f"verdict: {d['summary']}", colour, tty))
    if report.get("gpu"):
        _gpu(report["gpu"], add)
    for e in d["evidence"]:
        add(f"  - {e}")
    fixes = d.get("fixes") or d["commands"]
    if fixes:
        add(_style("fix (in this order):", "1", tty))
        for i, c in enumerate(fixes, 1):
            add(f"  {i}. {c}")
    for n in d["notes"]:
        if n not in fixes:
            add(f"  note: {n}")
    add("")
    if d["main"]:
        _table("main thread (the training loop)", d["main"], add)
    if d["workers"]:
        _table(f"DataLoader workers ({d['num_workers']})", d["workers"], add)
    if d["top_stacks"]:
        add("")
        add("hottest stacks (share of that role's samples):")
        for s in d["top_stacks"][:6]:
            add(f"  {s['role']:7s}{s['share']:5.0%}  {s['category']}/{s['detail']}: {s['frames']}")
    sc = report.get("syscalls")
    if sc:
        _syscalls(sc, t.get("processes", {}), t.get("workers", []), t["pid"], add)
    return "\n".join(lines)


def _gpu(gpu: Dict[str, Any], add) -> None:
    if not gpu.get("available"):
        add(f"GPU: not sampled ({gpu.get('reason')})")
        return
    for index, g in gpu["gpus"].items():
        used = " (used by the job)" if int(index) in gpu.get("job_gpus", []) else ""
        add(f"GPU {index}{used}: mean utilisation {g['mean_util']:.0f} %, {g['low_share']:.0%} of {g['samples']} "
            f"samples below 10 % ({gpu['backend']}, every {gpu['interval_s'] * 1000:.0f} ms)")
    if gpu.get("comparison"):
        add(f"  {gpu['comparison']}")


def _syscalls(sc: Dict[str, Any], processes: Dict, workers: List[int], main: int, add) -> None:
    how = {"perf": "perf trace", "strace": "strace; the job runs slower while traced, so these are upper bounds"}
    add("")
    add(f"system calls over {sc['seconds']:g} s ({how.get(sc['tracer'], sc['tracer'])}):")
    head = f"{'calls':>9s}{'p50 ms':>9s}{'p90 ms':>9s}{'p99 ms':>9s}{'max ms':>9s}{'>10 ms':>8s}{'MB':>9s}"
    add(f"  {'':14s}{head}")

    def row(label: str, g: Dict[str, Any], width: int = 14) -> str:
        return (f"{label:{width}s}{g['count']:9,d}{g['ms']['p50']:9.3f}{g['ms']['p90']:9.3f}{g['ms']['p99']:9.3f}"
                f"{g['max_ms']:9.2f}{g['over_10ms']:8.1%}{g['bytes'] / 1e6:9.1f}")

    for group, g in sc["groups"].items():
        add("  " + row(group, g))
    if len(sc.get("processes", {})) > 1 or any(str(p) != str(main) for p in sc.get("processes", {})):
        add("  per process:")
        for pid, groups in sc["processes"].items():
            role = "main" if int(pid) == main else ("worker" if int(pid) in workers else "other")
            add(f"    pid {pid} ({role})")
            for group, g in groups.items():
                add("      " + row(group, g, 10))
    block = sc.get("block") or {}
    if block.get("permitted"):
        lat = block.get("ms")
        add(f"  block layer ({block['scope']}): {block['read_requests']:,} read requests, "
            f"{block['read_bytes'] / 1e6:,.1f} MB" + (f", issue to completion p50 {lat['p50']:.2f} ms, p99 "
                                                       f"{lat['p99']:.2f} ms" if lat else ""))
    elif block:
        add(f"  block layer: not traced ({block.get('reason')})")
    for n in sc.get("notes", []):
        add(f"  note: {n}")
