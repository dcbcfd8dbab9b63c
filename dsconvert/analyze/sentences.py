"""Every sentence analyze prints, in one place, each made from the numbers it states.

The verdict (:mod:`.verdict`), the terminal report (:mod:`.report`) and the HTML page
(:mod:`dsconvert.html_report`) call these, so the three say the same thing in the same words,
and a sentence never claims more than the figures beside it (a concurrency sweep is told as
its points: first, best, last; never as a ratio that hides a fall).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["STAGES", "breakdown", "limit", "fix", "concurrency", "concurrency_reading", "fastest", "gain",
           "storage_limit", "spread", "split_caption", "main_limit"]

# one worker's time per sample, in the order the report lists it: key -> the words for it
STAGES = (("read", "read"), ("overhead", "per-file overhead"), ("decode", "decode"), ("transform", "transform"),
          ("other", "collate/IPC/other"))
GROWS = 2.0  # best over one reader at or above which concurrency is said to help


def _ms(x: float) -> str:
    return f"{x:.2f}"


def breakdown(per_worker_ms: Dict[str, float]) -> str:
    """``one worker per sample: 3.33 ms = read 0.26 + decode 2.10 + ...``: the parts add up to
    the total (they are computed so that they do)."""
    parts = " + ".join(f"{words} {_ms(per_worker_ms.get(key, 0.0))}" for key, words in STAGES
                       if key != "overhead" or per_worker_ms.get(key, 0.0) > 0)
    return f"one worker per sample: {_ms(per_worker_ms.get('total', 0.0))} ms = {parts}"


def limit(stage: str, per_worker_ms: Dict[str, float], close: Sequence[str] = ()) -> str:
    """What limits loading, a CPU stage: its ms of the total and the share, from the breakdown;
    with ``close``, the stages about as large, named beside it with their ms."""
    def part(name: str) -> Tuple[str, float]:
        key = "other" if name == "collate-ipc" else name
        return dict(STAGES)[key], per_worker_ms.get(key, 0.0)

    total = per_worker_ms.get("total", 0.0)
    words, ms = part(stage)
    if close:
        named = [part(stage)] + [part(c) for c in close]
        share = sum(m for _, m in named) / total if total > 0 else 0.0
        return (f"what limits loading: {' and '.join(w for w, _ in named)}, about equal shares ("
                + ", ".join(f"{w} {_ms(m)}" for w, m in named) + f" of {_ms(total)} ms per sample in a worker, "
                f"{share:.0%} together; named {words}, the first)")
    share = ms / total if total > 0 else 0.0
    return (f"what limits loading: {words}, {_ms(ms)} of {_ms(total)} ms per sample in a worker ({share:.0%}, "
            "the largest share)")


def main_limit(main_ms: float, busy: float) -> str:
    """What limits loading when it is the main process, which receives (and collates) every batch."""
    return (f"what limits loading: the main process receiving batches from the workers, {main_ms:.3f} ms of CPU "
            f"per sample, on a CPU {busy:.0%} of the time (at most {1000 / main_ms:,.0f} samples/s, whatever the "
            "workers do)")


def storage_limit(kind: str, read_share: float, cold_latency_ms: float, mean_file_bytes: float,
                  bandwidth_mb_s: float, sweep: Sequence[Tuple[int, float]]) -> str:
    """What limits loading when it is the storage: the kind, and the figures that told it."""
    said = {
        "storage-latency": f"storage latency, {cold_latency_ms:.1f} ms per cold file",
        "small-files": f"per-file overhead, {mean_file_bytes / 1e3:,.0f} kB files at {cold_latency_ms:.2f} ms each",
        "storage-bandwidth": f"storage bandwidth, {bandwidth_mb_s:,.0f} MB/s at best",
    }[kind]
    tail = f"; {concurrency(sweep)}" if sweep else ""
    return f"what limits loading: {said} (reading is {read_share:.0%} of a worker's time{tail})"


def gain(speedup: float, low: float, high: float) -> str:
    """``5.1x (4.1-6.2x)``: a measured gain with its range."""
    if high - low < 0.05 * speedup:
        return f"{speedup:.1f}x"
    return f"{speedup:.1f}x ({low:.1f}-{high:.1f}x)"


def fix(name: Optional[str], speedup: float, low: float, high: float, equals: Sequence[str],
        worth: float, rule: str) -> str:
    """The second answer: the fix that removes most of the limit, with its measured gain; or that
    none measured ``worth`` faster."""
    if name is None:
        return f"no output measured {worth}x faster than the data as it is"
    text = f"the fix that removes most of it: {name}, measured {gain(speedup, low, high)} faster"
    if equals:
        text += f" (within each other's range: {', '.join(equals)}; chosen {rule})"
    return text


def concurrency(sweep: Sequence[Tuple[int, float]], unit: str = "files") -> str:
    """The sweep as its points: ``1 reader 1,632 files/s, best 11,864/s at 8, 325/s at 16``."""
    pts = sorted(sweep)
    if not pts:
        return "no concurrency sweep was measured"
    (r0, v0), (rn, vn) = pts[0], pts[-1]
    rb, vb = max(pts, key=lambda p: p[1])
    text = f"{r0} reader{'s' if r0 != 1 else ''} {v0:,.0f} {unit}/s"
    if (rb, vb) not in ((r0, v0), (rn, vn)):
        text += f", best {vb:,.0f}/s at {rb}"
    if len(pts) > 1:
        text += f", {vn:,.0f}/s at {rn}"
    return text


def concurrency_reading(sweep: Sequence[Tuple[int, float]]) -> str:
    """What the sweep's points say, decided from them: whether more readers help, up to where."""
    pts = sorted(sweep)
    if len(pts) < 2 or pts[0][1] <= 0:
        return ""
    rb, vb = max(pts, key=lambda p: p[1])
    best = vb / pts[0][1]
    if best >= GROWS:
        fall = pts[-1][1] < 0.8 * vb
        return (f"concurrent reads help: the best is {best:.1f}x one reader's, at {rb}"
                + (f", and more readers than that lose ({pts[-1][1] / vb:.0%} of the best at {pts[-1][0]})"
                   if fall else "")
                + ": latency that parallel requests hide")
    return (f"more readers do not help: the best is {best:.1f}x one reader's: the storage's bandwidth, or the "
            "CPU, is the limit; fewer, larger reads (shards) or less data (a resized cache) do")


def fastest(v: Dict[str, Any]) -> str:
    """The line under the fix: the recommended output's measured rate against today's."""
    rec = v["recommended"]
    low, high = (v.get("speedup_range") or [v["predicted_speedup"]] * 2)[:2]
    return (f"fastest output that fits: {rec}, measured {v['predicted_per_s'][rec]:,.0f} samples/s through a "
            f"DataLoader with {v['workers']} workers: {gain(v['predicted_speedup'], low, high)} today's "
            f"{v['loader_per_s']:,.0f}")


def spread(runs: Sequence[float], unit: str = "") -> str:
    """`` (740-890 MB/s over 3 rounds)``: a repeated rate's spread, said beside its median."""
    if len(runs) < 2:
        return ""
    return f" ({min(runs):,.0f}-{max(runs):,.0f}{unit} over {len(runs)} rounds)"


def split_caption(v: Dict[str, Any], loader: Dict[str, Any], passes: Dict[str, Any]) -> str:
    """How one worker's time per sample was split, said beside the split itself."""
    source = passes.get("source") or {}
    memory = passes.get("from memory") or {}
    cache = v.get("cache", "warm")
    if cache == "warm" and source.get("warm_cpu_ms") and memory.get("warm_cpu_ms"):
        how = (f"read warm, from the workers' CPU clocks: {source['warm_cpu_ms']:.2f} ms per sample as it is, "
               f"{memory['warm_cpu_ms']:.2f} ms from memory; reading is the difference")
    elif cache == "cold" and source.get("cold_cpu_ms"):
        how = (f"read cold: {v['loader_per_s']:,.0f} samples/s as it is, the workers on a CPU for "
               f"{source['cold_cpu_ms']:.2f} ms per sample; reading is the time they were not")
    else:
        how = f"{v['loader_per_s']:,.0f} samples/s as it is" + (
            f", {memory['warm']:,.0f}/s from memory; reading is the difference" if memory.get("warm") else "")
    return (f"{breakdown(v['per_worker_ms'])}. From DataLoader passes with {v['workers']} workers and the "
            f"{loader.get('transform', '')} transform ({how}); decode and transform timed on their own (CPU "
            "time), the rest is collate, IPC and the worker loop.")


def join(parts: List[str]) -> str:
    return "; ".join(p for p in parts if p)
