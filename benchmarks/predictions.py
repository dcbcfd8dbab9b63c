"""Does analyze predict what a DataLoader then delivers? Prediction vs measurement, per output.

    python scripts/bench_predictions.py [--json docs/bench/predictions.json] [--rounds 2]

For each dataset (the demo photos, and a decode-heavy set of large JPEGs generated from the
same photographs), ``dsconvert.analyze`` predicts samples/s for the source as it is and for
each output it would make (measured on its sample); then the whole dataset is converted into
each of those outputs and ``dsconvert.bench`` reads the source and every output through the
same DataLoader (same workers, transform and decode mode), cold and warm. Rounds alternate
analyze and bench; the table gives the median ratio predicted / measured and its range.
"""

import argparse
import json
import re
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmeta import meta  # noqa: E402

from dsconvert import convert  # noqa: E402
from dsconvert.analyze import analyze  # noqa: E402
from dsconvert.bench import bench  # noqa: E402
from dsconvert.demo import make_demo_dataset  # noqa: E402
from dsconvert.processes import available_cpus  # noqa: E402


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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", "--out", dest="json", default="docs/bench/predictions.json")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--workers", type=int, default=available_cpus())
    args = p.parse_args()
    started = time.time()
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-predictions-") as tmp:
        demo = os.path.join(tmp, "photos")
        make_demo_dataset(demo)
        big = large_jpegs(os.path.join(tmp, "large"))
        # bench reads every sample of the small sets; batches small enough for a steady state
        for name, src, max_samples, batch in (("demo", demo, 1200, 64), ("large-jpegs", big, 192, 8)):
            scratch = os.path.join(tmp, f"out-{name}")
            os.makedirs(scratch)
            results.append(one_dataset(name, src, scratch, args.workers, args.rounds, 256, max_samples, batch))
    doc = {"meta": dict(meta(__file__), workers=args.workers, rounds=args.rounds,
                        seconds=round(time.time() - started)), "results": results}
    os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
    for res in results:
        print(f"\n{res['dataset']} ({args.workers} workers, eval transform)")
        print(f"{'output':28s}{'cache':>6s}{'predicted':>11s}{'measured':>10s}{'ratio':>7s}{'range':>14s}")
        for r in res["rows"]:
            print(f"{r['output'][:27]:28s}{r['cache']:>6s}{r['predicted']:11,.0f}{r['measured']:10,.0f}"
                  f"{r['ratio_median']:7.2f}  {r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}")


if __name__ == "__main__":
    main()
