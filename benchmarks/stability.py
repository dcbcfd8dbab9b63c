"""analyze's advice run after run: one bottleneck, one fix, gains within 1.5x, quiet or busy.

    python -m benchmarks stability [--runs 3] [--load 2] [--tiny 100000] [--json FILE]

Issue 41's check: ``dsconvert analyze --json`` run ``--runs`` times on a quiet machine and as
many beside ``--load`` busy processes (nice 0: a claim on the CPU like the job's own) on each
of three folders: photos in an ImageFolder, a flat folder of photos with JSON sidecars, and
``--tiny`` tiny JPEGs. Per folder it prints every run's bottleneck, recommended output and
predicted gain (with its range), and whether the folder held one bottleneck and one
recommendation with the gains within 1.5x of each other. Only prints (and writes ``--json``:
every run's verdict and the measurements it was decided from, which :func:`replay` runs
through a later :func:`decide`; tests/test_verdict_replay.py does, on the recorded file).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from benchmarks.common import meta
from benchmarks.scenarios import background_load, jpegs

GAIN_SPREAD = 1.5  # the most the predicted gains of one folder's runs may differ (max / min)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", type=int, default=3, help="runs per folder quiet, and as many busy (default 3)")
    p.add_argument("--load", type=int, default=2, help="busy processes beside the busy runs (default 2)")
    p.add_argument("--photos", type=int, default=240, help="photos in the ImageFolder (default 240)")
    p.add_argument("--tiny", type=int, default=100_000, help="tiny JPEGs (default 100,000)")
    p.add_argument("--json", help="write every run's verdict here")


QUICK = ["--runs", "1", "--load", "1", "--photos", "24", "--tiny", "400"]


def folders(tmp: str, a: argparse.Namespace) -> Dict[str, str]:
    photos = jpegs(os.path.join(tmp, "photos"), a.photos, (500, 375))
    flat = os.path.join(tmp, "flat")
    os.makedirs(flat)
    src = jpegs(os.path.join(tmp, "flat-src"), a.photos, (500, 375))
    i = 0
    for d in sorted(os.listdir(src)):
        for name in sorted(os.listdir(os.path.join(src, d))):
            os.rename(os.path.join(src, d, name), os.path.join(flat, f"{i:06d}.jpg"))
            with open(os.path.join(flat, f"{i:06d}.json"), "w") as f:
                json.dump({"label": int(d.removeprefix("class")), "id": i}, f)
            i += 1
    tiny = jpegs(os.path.join(tmp, "tiny"), a.tiny, (32, 32), classes=10, noise=True)
    return {"photos (ImageFolder)": photos, "flat folder with sidecars": flat, f"{a.tiny:,} tiny JPEGs": tiny}


def analyze_json(path: str, out: str) -> Dict[str, Any]:
    run = subprocess.run([sys.executable, "-m", "dsconvert", "analyze", path, "--json", "-q", "--output-dir", out],
                         capture_output=True, text=True, timeout=3600)
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip()[-400:])
    report = json.loads(run.stdout)
    v = report["verdict"]
    record = {k: v.get(k) for k in ("bottleneck", "limit", "recommended", "predicted_speedup", "speedup_range",
                                    "equal_alternatives", "summary")}
    record["measurements"] = report["measurements"]  # what decide saw: a later rule is replayed on it
    return record


def replay(record: Dict[str, Any]) -> Any:
    """The verdict today's :func:`decide` gives on a run's recorded measurements."""
    from dsconvert.analyze import Measurements, decide

    m = dict(record["measurements"])
    m["sweep"] = [tuple(point) for point in m.get("sweep") or []]
    return decide(Measurements(**m))


def run(a: argparse.Namespace) -> int:
    results: Dict[str, List[Dict[str, Any]]] = {}
    ok_all = True
    with tempfile.TemporaryDirectory(prefix="dsconvert-stability-") as tmp:
        out = os.path.join(tmp, "out")
        os.makedirs(out)
        for name, path in folders(tmp, a).items():
            runs = results[name] = []
            for load in [0] * a.runs + [a.load] * a.runs:
                with background_load(load, nice=0):
                    r = analyze_json(path, out)
                r["load"] = load
                runs.append(r)
                low, high = r["speedup_range"] or [1.0, 1.0]
                print(f"{name} (busy processes: {load}): {r['bottleneck']}, {r['recommended']}, "
                      f"{r['predicted_speedup']:.1f}x ({low:.1f}-{high:.1f}x)", flush=True)
            gains = [r["predicted_speedup"] for r in runs]
            one = len({r["bottleneck"] for r in runs}) == 1 and len({r["recommended"] for r in runs}) == 1
            spread = max(gains) / max(min(gains), 1e-9)
            ok = one and spread <= GAIN_SPREAD
            ok_all &= ok
            print(f"{'ok  ' if ok else 'MISS'} {name}: {len({r['bottleneck'] for r in runs})} bottleneck(s), "
                  f"{len({r['recommended'] for r in runs})} recommendation(s), gains {min(gains):.1f}-"
                  f"{max(gains):.1f}x ({spread:.2f}x apart)\n", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"meta": dict(meta(), runs=a.runs, load=a.load), "folders": results}, f, indent=1)
    return 0 if ok_all else 1


def runs_of(data: Dict[str, Any]) -> Dict[str, List[Dict[str, Any]]]:
    """folder -> its runs, from a record (older records are the mapping itself)."""
    return data["folders"] if "folders" in data else data


def render(data: Dict[str, Any]) -> str:
    from collections import Counter

    folders = runs_of(data)
    meta = data.get("meta", {})
    lines = [f"Each folder analysed {meta.get('runs', 3)} times with no busy process of its own (other jobs of the "
             f"machine share its 2 cores: not a quiet machine) and {meta.get('runs', 3)} times beside "
             f"{meta.get('load', 2)} busy processes at nice 0; *held*: one bottleneck, one recommended output, and "
             f"predicted gains within {GAIN_SPREAD}x of each other. Gains: the 6 runs' point estimates, min-max, "
             "median; the range is each run's own.", "",
             "| folder | bottleneck (runs) | recommended (runs) | predicted gains, min-max [median] | each run's range "
             "| held |", "| --- | --- | --- | --- | --- | --- |"]
    for name, runs in folders.items():
        gains = sorted(r["predicted_speedup"] for r in runs)
        median = statistics.median(gains)
        low = min((r["speedup_range"] or [1, 1])[0] for r in runs)
        high = max((r["speedup_range"] or [1, 1])[1] for r in runs)
        bottlenecks = Counter(r["bottleneck"] for r in runs)
        recommended = Counter(str(r["recommended"]) for r in runs)
        spread = gains[-1] / max(gains[0], 1e-9)
        held = len(bottlenecks) == 1 and len(recommended) == 1 and spread <= GAIN_SPREAD
        said = ", ".join(f"`{k}` x{n}" for k, n in recommended.most_common())
        lines.append(f"| {name} | {', '.join(f'{k} x{n}' for k, n in bottlenecks.most_common())} | {said} | "
                     f"{gains[0]:.1f}-{gains[-1]:.1f}x [{median:.1f}x] ({spread:.2f}x apart) | {low:.1f}-{high:.1f}x | "
                     f"{'yes' if held else 'no'} |")
    return "\n".join(lines) + "\n"


TABLES = {"stability": {"argv": lambda a: [], "render": render}}
