"""The cost of issue 13's decode checks: the fast decoder's own header read (for the pixel limit)
and strict libjpeg warnings, against the codecs module of a given git revision, interleaved.

    python scripts/bench_decode_checks.py [REV]   # REV: the revision to compare with (b327f7e)
"""
import importlib.util, io, os, subprocess, sys, tempfile, time, statistics
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from dsconvert import codecs as new
from dsconvert.demo import load_photos
rev = sys.argv[1] if len(sys.argv) > 1 else "b327f7e"
old_path = os.path.join(tempfile.mkdtemp(), "codecs_old.py")
with open(old_path, "wb") as f:
    f.write(subprocess.run(["git", "show", f"{rev}:dsconvert/codecs.py"], cwd=ROOT, capture_output=True, check=True).stdout)
spec = importlib.util.spec_from_file_location("dsconvert.codecs_old", old_path)
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
photos = load_photos(("astronaut", "coffee", "chelsea"))
imgs = []
for side in (64, 160, 500):
    for p in photos.values():
        b = io.BytesIO(); p.resize((side, int(side * .75))).save(b, "JPEG", quality=90); imgs.append((side, b.getvalue()))
for side in (64, 160, 500):
    data = [d for s, d in imgs if s == side] * 100
    ratios = []
    for rnd in range(5):
        t = time.perf_counter(); [old.decode_rgb(d, "turbojpeg") for d in data]; a = time.perf_counter() - t
        t = time.perf_counter(); [new.decode_rgb(d, "turbojpeg") for d in data]; b = time.perf_counter() - t
        ratios.append(b / a)
    print(f"{side}px: new/old time median {statistics.median(ratios):.3f} range {min(ratios):.3f}-{max(ratios):.3f}; old {a/len(data)*1e6:.0f} us/img")
