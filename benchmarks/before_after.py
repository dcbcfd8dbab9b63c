"""The read and write paths of a git revision ("before") against this checkout ("after"),
in alternating fresh processes, 5 rounds, medians and ranges of the per-round ratios: 4,000
photos of 160x120, conversion with one worker and --no-verify, a warm pass of every sample
(wds decode="raw", npy decode="numpy").

    python scripts/bench_before_after.py [REV]   # REV defaults to b327f7e
"""
import os, shutil, statistics, subprocess, sys, tempfile
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
rev = sys.argv[1] if len(sys.argv) > 1 else "b327f7e"
work = tempfile.mkdtemp()
old_tree = os.path.join(work, "before-tree")
subprocess.run(["git", "worktree", "add", "-q", "--detach", old_tree, rev], cwd=ROOT, check=True)
TREES = {"before": old_tree, "after": ROOT}
src = os.path.join(work, "src")
subprocess.run([PY, "-c", f"""
import sys; sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
from conftest import make_image_folder
from dsconvert.demo import load_photos
make_image_folder({src!r}, load_photos(('astronaut','coffee','chelsea','rocket','camera')), {{'a': 1000, 'b': 1000, 'c': 1000, 'd': 1000}}, size=(160, 120))
"""], check=True, cwd=ROOT)
READ = """
import sys, time; sys.path.insert(0, sys.argv[1])
from dsconvert import open_dataset
ds = open_dataset(sys.argv[2], decode=sys.argv[3])
list(ds)  # warm-up
t = time.perf_counter(); n = sum(1 for _ in ds); print(n / (time.perf_counter() - t))
"""
WRITE = """
import sys, time, shutil; sys.path.insert(0, sys.argv[1])
from dsconvert import convert
t = time.perf_counter(); convert(sys.argv[2], sys.argv[3], sys.argv[4], samples_per_shard=1000, workers=1, verify=False)
print(4000 / (time.perf_counter() - t))
"""
res = {}
for fmt in ("wds", "npy"):
    out = os.path.join(work, f"out-{fmt}")
    subprocess.run([PY, "-c", WRITE, ROOT, src, out, fmt], check=True, capture_output=True)
    for rnd in range(5):
        for name, tree in TREES.items():
            for mode in (("raw",) if fmt == "wds" else ("numpy",)):
                r = float(subprocess.run([PY, "-c", READ, tree, out, mode], check=True, capture_output=True, text=True, cwd="/tmp").stdout)
                res.setdefault(f"read {fmt} {mode} {name}", []).append(r)
            o = os.path.join(work, f"w-{name}-{fmt}")
            shutil.rmtree(o, ignore_errors=True)
            w = float(subprocess.run([PY, "-c", WRITE, tree, src, o, fmt], check=True, capture_output=True, text=True, cwd="/tmp").stdout)
            res.setdefault(f"write {fmt} {name}", []).append(w)
for k in sorted(res):
    v = res[k]; print(f"{k:28s} median {statistics.median(v):10,.0f}/s  range {min(v):,.0f}-{max(v):,.0f}")
for key in sorted({k.rsplit(' ', 1)[0] for k in res}):
    a, b = res[key + " before"], res[key + " after"]
    ratios = [y / x for x, y in zip(a, b)]
    print(f"{key:22s} after/before median {statistics.median(ratios):.2f} range {min(ratios):.2f}-{max(ratios):.2f}")
subprocess.run(["git", "worktree", "remove", "--force", old_tree], cwd=ROOT, check=False)
shutil.rmtree(work)
