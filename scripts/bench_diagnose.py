"""Benchmark: what `dsconvert diagnose` costs the job it samples. A decode-bound training
job (scripts/train_job.py: large JPEGs, DataLoader workers, a numpy "model") reports its
steps per second; the rate is compared before and while py-spy samples it, and while strace
traces it (--syscalls), in the same run.

    python scripts/bench_diagnose.py --seconds 8 --json bench_diagnose.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from dsconvert.demo import load_photos  # noqa: E402


def make_data(root: str, per_class: int = 8) -> str:
    if not os.path.isdir(root):
        for name, photo in load_photos(("astronaut", "chelsea", "coffee", "rocket")).items():
            os.makedirs(os.path.join(root, name))
            for i in range(per_class):
                photo.convert("RGB").resize((1280, 960)).rotate(i).save(
                    os.path.join(root, name, f"{i}.jpg"), "JPEG", quality=95)
    return root


class RateReader(threading.Thread):
    """Collects the job's "rate N" lines with the time they arrived."""

    def __init__(self, proc):
        super().__init__(daemon=True)
        self.proc, self.rates = proc, []

    def run(self):
        for line in self.proc.stdout:
            if line.startswith("rate "):
                self.rates.append((time.monotonic(), int(line.split()[1])))

    def between(self, a, b):
        return [r for t, r in self.rates if a < t <= b]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "dsconvert-bench-diagnose"))
    p.add_argument("--json")
    args = p.parse_args()
    data = make_data(os.path.join(args.work, "train"))
    job = subprocess.Popen([sys.executable, os.path.join(HERE, "train_job.py"), "--data", data, "--workers",
                            str(args.workers), "--batch", "4", "--compute-ms", "5", "--print-rate"],
                           stdout=subprocess.PIPE, text=True, start_new_session=True)
    res = {}
    try:
        assert job.stdout.readline().strip() == "ready"
        reader = RateReader(job)
        reader.start()
        time.sleep(2)  # past start-up
        phases = [("baseline", None), ("pyspy", []), ("baseline_again", None), ("strace", ["--syscalls"])]
        for name, extra in phases:
            t0 = time.monotonic()
            if extra is None:
                time.sleep(args.seconds)
            else:
                cmd = [sys.executable, "-m", "dsconvert", "diagnose", "--pid", str(job.pid), "--json", "-q"]
                if extra:  # strace only: sample briefly, then trace for the phase
                    cmd += ["--duration", "1", "--syscalls", str(args.seconds)]
                else:
                    cmd += ["--duration", str(args.seconds)]
                run = subprocess.run(cmd, capture_output=True, text=True, check=True)
                res[f"{name}_verdict"] = json.loads(run.stdout)["diagnosis"]["verdict"]
                if extra:
                    t0 = time.monotonic() - args.seconds  # only the traced seconds
            rates = reader.between(t0 + 1, time.monotonic())
            res[f"{name}_steps_per_s"] = statistics.median(rates) if rates else 0.0
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    base = statistics.mean([res["baseline_steps_per_s"], res["baseline_again_steps_per_s"]])
    res["pyspy_slowdown"] = 1 - res["pyspy_steps_per_s"] / base
    res["strace_slowdown"] = 1 - res["strace_steps_per_s"] / base
    for k, v in res.items():
        print(f"{k:28s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
