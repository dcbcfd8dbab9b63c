"""The diagnose half of scripts/scenarios.py: real training jobs (scripts/train_job.py: a real
DataLoader feeding a fixed CPU "model" step) launched under ``dsconvert diagnose``, each with
the verdict a user should get. Run through scripts/scenarios.py (which adds background load),
or alone: ``python scripts/diagnose_scenarios.py``.
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOB = os.path.join(HERE, "train_job.py")
sys.path.insert(0, ROOT)

from scenarios import jpegs, run_commands, slow_mount  # noqa: E402


def diagnose(job: List[str], wait: float = 8.0, duration: float = 4.0, extra: Tuple[str, ...] = ()) -> Dict:
    argv = [sys.executable, "-m", "dsconvert", "diagnose", "--json", "-q", "--wait", str(wait),
            "--duration", str(duration), *extra, "--", sys.executable, JOB, *job]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if run.returncode != 0:
        raise RuntimeError(run.stderr.strip()[-400:])
    return json.loads(run.stdout)


def scenarios(tmp: str) -> List[Tuple[str, callable, Tuple[Optional[str], ...]]]:
    big = os.path.join(tmp, "diag-big")

    def big_jpegs() -> str:
        if not os.path.isdir(big):
            jpegs(big, 24, (1600, 1200), classes=3, quality=95)
        return big

    def decode():
        return diagnose(["--data", big_jpegs(), "--workers", "2", "--batch", "4", "--compute-ms", "5"])

    def no_workers():
        return diagnose(["--data", big_jpegs(), "--workers", "0", "--batch", "4", "--compute-ms", "5"])

    def augment(lib: str):
        return lambda: diagnose(["--data", big_jpegs(), "--workers", "1", "--batch", "4", "--compute-ms", "5",
                                 "--augment", lib])

    def pickles():
        root = os.path.join(tmp, "diag-pickles")
        os.makedirs(root, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(48):
            with open(os.path.join(root, f"{i:04d}.pkl"), "wb") as f:
                pickle.dump((rng.integers(0, 256, (600, 800, 3), dtype=np.uint8), i % 4), f)
        return diagnose(["--data", root, "--pickles", "--workers", "0", "--batch", "4", "--compute-ms", "1"])

    def converted():
        from dsconvert import convert

        out = os.path.join(tmp, "diag-npy")
        if not os.path.isdir(out):
            convert(big_jpegs(), out, "npy", resize=256, verify=False)
        return diagnose(["--data", out, "--converted", "--workers", "1", "--batch", "4", "--compute-ms", "40"])

    def compute_bound():
        return diagnose(["--in-memory", "16", "--workers", "1", "--batch", "2", "--compute-ms", "300"])

    def slow_storage():
        backing = jpegs(os.path.join(tmp, "diag-slow-backing"), 60, (160, 120))
        with slow_mount(backing, os.path.join(tmp, "diag-slow-mnt"), 15.0) as mnt:
            report = diagnose(["--data", mnt, "--workers", "1", "--batch", "8", "--compute-ms", "2"], wait=10)
            report["_ran"] = run_commands(report["diagnosis"]["commands"])  # while the mount is there
            return report

    return [
        ("large JPEGs, 2 workers", decode, ("decode",)),
        ("num_workers=0", no_workers, ("no-workers",)),
        ("scipy.ndimage blur + rotation in the transform", augment("scipy"), ("augment",)),
        ("numpy flip + jitter + noise in the transform", augment("numpy"), ("augment",)),
        ("plain-Python per-pixel jitter in the transform", augment("python"), ("augment",)),
        ("pickled samples, num_workers=0", pickles, ("no-workers",)),
        ("a converted npy cache, heavy model step", converted, (None,)),
        ("data in memory, heavy model step", compute_bound, (None,)),
        ("JPEGs behind FUSE + 15 ms per request", slow_storage, ("read",)),
    ]


def run_all(tmp: str) -> List[Dict]:
    rows = []
    for name, run, expected in scenarios(tmp):
        t = time.perf_counter()
        try:
            report = run()
        except Exception as exc:
            rows.append({"tool": "diagnose", "scenario": name, "expected": list(expected), "got": "error",
                         "ok": False, "summary": f"{type(exc).__name__}: {exc}"})
            print(f"diagnose ERROR {name}: {exc}", flush=True)
            continue
        d = report["diagnosis"]
        ran = report.pop("_ran", None) or run_commands(d["commands"])
        got = d["bottleneck"]
        ok = got in expected and all(code == 0 for _, code in ran)
        rows.append({"tool": "diagnose", "scenario": name, "expected": list(expected), "got": got, "ok": ok,
                     "summary": d["summary"], "commands": ran, "seconds": round(time.perf_counter() - t, 1)})
        print(f"diagnose {'ok  ' if ok else 'MISS'} {name}: {got} ({d['summary']})"
              + "".join(f"\n         ran {c!r}: exit {code}" for c, code in ran), flush=True)
    return rows


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="dsconvert-diagnose-scenarios-") as tmp:
        rows = run_all(tmp)
    print(f"\n{sum(r['ok'] for r in rows)} of {len(rows)} verdicts right")
