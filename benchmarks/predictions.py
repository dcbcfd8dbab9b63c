"""Does analyze predict what a DataLoader then delivers? Prediction vs measurement, per output.

    python -m benchmarks predictions [--json docs/bench/predictions.json] [--rounds 2]

For each dataset (the demo photos, and a decode-heavy set of large JPEGs generated from the
same photographs), ``dsconvert.analyze`` predicts samples/s for the source as it is and for
each output it would make (measured on its sample); then the whole dataset is converted into
each of those outputs and ``dsconvert.bench`` reads the source and every output through the
same DataLoader (same workers, transform and decode mode), cold and warm. Rounds alternate
analyze and bench; the table gives the median ratio predicted / measured and its range.
"""

import argparse
import json
import os
import re
import statistics
import tempfile
import time
from typing import Any, Dict, List

from benchmarks.common import fmt_range, meta
from dsconvert import convert
from dsconvert.analyze import analyze
from dsconvert.bench import bench
from dsconvert.demo import make_demo_dataset
from dsconvert.processes import available_cpus


def large_jpegs(root: str, count: int = 192) -> str:
    """Decode-heavy: 2400x1800 JPEGs of quality 92 (about 1 MB each)."""
    from PIL import Image

    from dsconvert.demo import load_photos

    photos = load_photos()
    names = sorted(photos)
    for i in range(count):
        cls = names[i % 4]
        img = photos[cls].convert("RGB").resize((2400, 1800), Image.Resampling.BICUBIC).rotate(i % 7)
        folder = os.path.join(root, cls)
        os.makedirs(folder, exist_ok=True)
        img.save(os.path.join(folder, f"{i:05d}.jpg"), quality=92)
    return root


def one_dataset(name: str, src: str, scratch: str, workers: int, rounds: int, sample: int, max_samples: int,
                batch: int) -> dict:
    rows = {}
    outputs = {}
    for r in range(rounds):
        report = analyze(src, sample=sample, workers=workers, seed=r, output_dir=scratch, batch_size=batch)
        cache = report["loader"]["cache"]
        passes = report["loader"]["passes"]
        for option, row in passes.items():
            if option == "from memory":
                continue
            if option != "source" and option not in outputs:
                out = os.path.join(scratch, f"{name}-{len(outputs)}")
                convert(src, out, row["format"], verify=False, force=True, workers=workers, **row.get("options", {}))
                outputs[option] = (out, row["decode"])
        paths = {"source": (src, "pil")}
        # the candidates come from each round's sample (a --max-size from its geometry): bench
        # what this round predicted
        paths.update((option, out) for option, out in outputs.items() if option in passes)
        for option, (path, decode) in paths.items():
            measured = bench([path], workers=[workers], batch_sizes=[batch], decode=decode, max_samples=max_samples,
                             transform="eval", seed=r)
            for run in measured["runs"]:
                # --max-size comes from each round's sample: one row for all its values
                key = (re.sub(r"--max-size \d+", "--max-size N", option), run["cache"])
                entry = rows.setdefault(key, {"predicted": [], "measured": []})
                entry["predicted"].append(passes[option].get(run["cache"], 0.0))
                entry["measured"].append(run["samples_per_s"])
        print(f"{name}: round {r + 1} done (predictions from the {cache} passes)", flush=True)
    table = []
    for (option, cache), entry in rows.items():
        ratios = [p / m for p, m in zip(entry["predicted"], entry["measured"]) if m > 0]
        table.append({"output": option, "cache": cache, "predicted": statistics.median(entry["predicted"]),
                      "measured": statistics.median(entry["measured"]),
                      "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
                      "rounds": len(ratios)})
    return {"dataset": name, "source": src, "batch_size": batch, "max_samples": max_samples, "rows": table}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", "--out", dest="json", help="write the figures here (docs/bench/predictions.json)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--demo-per-class", type=int, help="demo photos per class (default: the demo's own count)")
    p.add_argument("--large", type=int, default=192, help="large JPEGs in the decode-heavy set")
    p.add_argument("--workers", type=int, default=available_cpus())


def run(args: argparse.Namespace) -> None:
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-predictions-") as tmp:
        demo = os.path.join(tmp, "photos")
        make_demo_dataset(demo, **({"num_per_class": args.demo_per_class} if args.demo_per_class else {}))
        big = large_jpegs(os.path.join(tmp, "large"), args.large)
        # bench reads every sample of the small sets; batches small enough for a steady state
        for name, src, max_samples, batch in (("demo", demo, 1200, 64), ("large-jpegs", big, 192, 8)):
            scratch = os.path.join(tmp, f"out-{name}")
            os.makedirs(scratch)
            results.append(one_dataset(name, src, scratch, args.workers, args.rounds, 256, max_samples, batch))
    doc = {"meta": dict(meta(), workers=args.workers, rounds=args.rounds,
                        seconds=round(time.time() - started)), "results": results}
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    for res in results:
        print(f"\n{res['dataset']} ({args.workers} workers, eval transform)")
        print(f"{'output':28s}{'cache':>6s}{'predicted':>11s}{'measured':>10s}{'ratio':>7s}{'range':>14s}")
        for r in res["rows"]:
            print(f"{r['output'][:27]:28s}{r['cache']:>6s}{r['predicted']:11,.0f}{r['measured']:10,.0f}"
                  f"{r['ratio_median']:7.2f}  {r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}")


def render(data: Dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [f"{meta['workers']} DataLoader workers, the eval transform; {meta['rounds']} interleaved rounds (analyze, "
             "then bench of every output, per round); predicted and measured samples/s are medians, the ratio is "
             "predicted / measured, median [range] of the per-round ratios. Goal: within 0.70-1.30."]
    medians = []
    for res in data["results"]:
        lines += ["", f"**{res['dataset']}** (batch {res['batch_size']}, bench reads {res['max_samples']:,} samples):",
                  "", "| output | pass | predicted samples/s | measured | predicted / measured |",
                  "| --- | --- | --- | --- | --- |"]
        groups: Dict[tuple, List[Dict[str, Any]]] = {}
        for r in res["rows"]:  # --max-size comes from each round's sample: one row for its values
            groups.setdefault((re.sub(r"--max-size \d+", "--max-size N", r["output"]), r["cache"]), []).append(r)
        for (output, cache), rows in groups.items():
            if len(rows) == 1:
                r = rows[0]
                ratio, lo, hi = r["ratio_median"], *r["ratio_range"]
                predicted, measured = r["predicted"], r["measured"]
            else:  # one round each (different N): the medians over the rounds
                ratio = statistics.median(r["ratio_median"] for r in rows)
                lo, hi = min(r["ratio_range"][0] for r in rows), max(r["ratio_range"][1] for r in rows)
                predicted = statistics.median(r["predicted"] for r in rows)
                measured = statistics.median(r["measured"] for r in rows)
            medians.append(ratio)
            lines.append(f"| {output} | {cache} | {predicted:,.0f} | {measured:,.0f} | "
                         f"{fmt_range(ratio, lo, hi, '{:.2f}')} |")
    if medians:
        inside = sum(0.7 <= m <= 1.3 for m in medians)
        lines += ["", f"{inside} of {len(medians)} median ratios within 0.70-1.30 (all: {min(medians):.2f}-"
                  f"{max(medians):.2f})."]
    return "\n".join(lines) + "\n"


QUICK = ["--rounds", "1", "--demo-per-class", "2", "--large", "4", "--workers", "1"]
TABLES = {"predictions": {"argv": lambda a: ["--rounds", str(a.rounds)], "render": render}}
