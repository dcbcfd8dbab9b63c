"""Fixtures: small datasets of real JPEG/PNG files, made from scikit-image's photographs."""

from __future__ import annotations

import io
import os
import random
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import uuid
from typing import Dict, List, Tuple

import numpy as np
import pytest
from hypothesis import settings
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Hypothesis profiles: "fast", the default, for a contributor's runs; "thorough" in CI (.ci/run
# sets HYPOTHESIS_PROFILE=thorough). A test that names its example count passes it through
# examples(), so that it too is cut down in the fast profile.
settings.register_profile("thorough", max_examples=100, deadline=None)
settings.register_profile("fast", max_examples=15, deadline=None)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fast")
settings.load_profile(HYPOTHESIS_PROFILE)


def examples(thorough: int) -> int:
    """A property test's example count: ``thorough`` in the thorough profile (CI), a tenth of
    it (at least 5) in the fast one."""
    return thorough if HYPOTHESIS_PROFILE == "thorough" else max(5, thorough // 10)


def can_build_extensions(*headers: str) -> bool:
    """Whether a C compiler, Python's headers and these system headers are here: then the
    install built dsconvert's C extensions (setup.py), and a missing one is a failed build."""
    python_h = os.path.join(sysconfig.get_paths()["include"], "Python.h")
    return bool(shutil.which("cc") or shutil.which("gcc")) and all(map(os.path.exists, (python_h, *headers)))


@pytest.fixture(autouse=True)
def _default_cache_in_tmp(tmp_path_factory, monkeypatch):
    """Remote outputs are cached by default (dsconvert/io/default_cache.py): every test's default
    cache is a folder of its own under pytest's temporary root, never the user's ~/.cache, and
    never shared between tests (its subprocesses and DataLoader workers inherit it)."""
    monkeypatch.setenv("DSCONVERT_CACHE", str(tmp_path_factory.mktemp("dsconvert-cache")))
    monkeypatch.delenv("DSCONVERT_CACHE_SIZE", raising=False)


@pytest.fixture(autouse=True)
def _analyze_without_paired_rounds(monkeypatch):
    """analyze's paired rounds (dsconvert/analyze/loader.py: the gains measured again beside the
    data as it is, 3 to 5 rounds of every output) multiply its passes; tests check analyze's
    verdicts and exit statuses, not its steadiness, so they run without them unless a test asks
    (tests/test_analyze.py runs them end to end, test_verdict.py decides from recorded ones)."""
    monkeypatch.setenv("DSCONVERT_ANALYZE_ROUNDS", "0")


@pytest.fixture(scope="session")
def torch():
    """torch, for the tests that use it (take ``torch`` as an argument, or
    ``@pytest.mark.usefixtures("torch")`` when only a subprocess imports it): only those tests
    are skipped where torch is not installed, never the torch-free ones beside them."""
    return pytest.importorskip("torch", reason="torch is not installed (pip install 'dsconvert[torch]')")


@pytest.fixture(scope="session")
def photos() -> Dict[str, Image.Image]:
    from dsconvert.demo import load_photos

    return load_photos(("astronaut", "camera", "chelsea", "coffee", "rocket"))


def crop(photo: Image.Image, rng: random.Random, size: Tuple[int, int] = (96, 72)) -> Image.Image:
    w, h = photo.size
    cw, ch = rng.randint(w // 3, w), rng.randint(h // 3, h)
    x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
    return photo.crop((x, y, x + cw, y + ch)).resize(size)


def encode(img: Image.Image, fmt: str = "JPEG", **kw) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def jpeg_crops(photos: Dict[str, Image.Image], n: int, seed: int = 0) -> List[bytes]:
    """``n`` JPEGs cropped from the photos, of a few sizes: the members of test tar shards."""
    rng = random.Random(seed)
    names = sorted(photos)
    return [encode(crop(photos[names[i % len(names)]], rng, (40 + i % 7, 32))) for i in range(n)]


def write(path: str, data: bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return path


@pytest.fixture(scope="session")
def image_kinds(photos) -> Dict[str, Tuple[str, bytes]]:
    """One file of every kind ImageFolder meets: name -> (extension, bytes)."""
    rng = random.Random(1)
    rgb = crop(photos["astronaut"], rng)
    return {
        "baseline": ("jpg", encode(rgb, quality=90)),
        "progressive": ("jpg", encode(crop(photos["coffee"], rng), quality=85, progressive=True)),
        "grayscale": ("jpg", encode(crop(photos["camera"], rng).convert("L"), quality=90)),
        "cmyk": ("jpg", encode(crop(photos["chelsea"], rng).convert("CMYK"), quality=90)),
        "png": ("png", encode(crop(photos["rocket"], rng), "PNG")),
        "palette_png": ("png", encode(crop(photos["rocket"], rng).convert("P"), "PNG")),
        "png_named_jpeg": ("JPEG", encode(crop(photos["coffee"], rng), "PNG")),
    }


def make_image_folder(root: str, photos, classes: Dict[str, int], seed: int = 0,
                      size: Tuple[int, int] = (96, 72)) -> List[str]:
    """root/<class>/<class>_<i>.jpg from crops of the class's photograph."""
    rng = random.Random(seed)
    names = list(photos)
    paths = []
    for ci, (cls, n) in enumerate(sorted(classes.items())):
        photo = photos[names[ci % len(names)]]
        for i in range(n):
            paths.append(write(os.path.join(root, cls, f"{cls}_{i:04d}.jpg"),
                               encode(crop(photo, rng, size), quality=rng.randint(70, 95))))
    return paths


@pytest.fixture
def image_folder(tmp_path, photos) -> str:
    root = str(tmp_path / "src")
    make_image_folder(root, photos, {"cat": 7, "dog": 5, "zebra": 4})
    return root


@pytest.fixture
def mixed_folder(tmp_path, image_kinds) -> str:
    """An ImageFolder holding every image kind (CMYK, grayscale, PNG named .JPEG...)."""
    root = str(tmp_path / "mixed")
    for i, (kind, (ext, data)) in enumerate(sorted(image_kinds.items())):
        write(os.path.join(root, f"c{i % 3}", f"{kind}.{ext}"), data)
    return root


def reference_image_folder(root: str) -> List[Tuple[str, int]]:
    """torchvision.datasets.ImageFolder's make_dataset, re-implemented as it is written there."""
    exts = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
    classes = sorted(e.name for e in os.scandir(root) if e.is_dir())
    out = []
    for idx, cls in enumerate(classes):
        for dirpath, _, fnames in sorted(os.walk(os.path.join(root, cls), followlinks=True)):
            for fname in sorted(fnames):
                if fname.lower().endswith(exts):
                    out.append((os.path.join(dirpath, fname), idx))
    return out


def pil_loader(path: str) -> Image.Image:
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def same_pixels(a, b) -> bool:
    return np.array_equal(np.asarray(a), np.asarray(b))


def _slow_args(param) -> list:
    delay, cap = param if isinstance(param, tuple) else (param, 0)
    return ["--delay-ms", str(delay), "--mb-per-s", str(cap)]


@pytest.fixture
def slow_mount(tmp_path, request):
    """The slow FUSE passthrough of tests/support/slowfs.py, mounted over a folder of ours; the
    parameter is the delay in ms, or (delay ms, MB/s cap of all readers together)."""
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount"):
        pytest.skip("this machine has no FUSE (/dev/fuse and fusermount: apt-get install fuse libfuse2)")
    pytest.importorskip("fuse", reason="fusepy is not installed")
    backing, mnt = tmp_path / "backing", tmp_path / "mnt"
    backing.mkdir()
    mnt.mkdir()
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "support", "slowfs.py"), str(backing),
                             str(mnt)] + _slow_args(getattr(request, "param", 2)), stderr=subprocess.PIPE)
    deadline = time.time() + 10
    while not os.path.ismount(mnt):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.skip(f"FUSE mount failed here: {proc.stderr.read().decode()[-300:]}")
        time.sleep(0.05)
    try:
        yield backing, mnt
    finally:
        deadline = time.time() + 10
        while subprocess.run(["fusermount", "-u", str(mnt)], capture_output=True).returncode != 0:
            if time.time() > deadline:  # still busy: detach now, it goes when its last user does
                subprocess.run(["fusermount", "-uz", str(mnt)], check=False)
                break
            time.sleep(0.1)
        proc.wait(timeout=10)


def rehash_parts(out: str) -> None:
    """Make the manifest's digests of every shard's small files (index, samples table) agree
    with what is on disk: an output changed on purpose and made consistent, as a hostile
    download could be, so that the checks past the digests are what is tested."""
    import hashlib
    import json

    path = os.path.join(out, "dsconvert.json")
    manifest = json.load(open(path))
    for shard in manifest["shards"]:
        for name in shard.get("parts", {}):
            data = open(os.path.join(out, name), "rb").read()
            shard["parts"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    json.dump(manifest, open(path, "w"))


# nvidia-smi as the sampler calls it: --query-gpu=index,utilization.gpu,memory.used ... -lms MS prints
# one line per GPU every MS ms until it is stopped; --query-compute-apps and --query-gpu=index,uuid
# answer once. FAKE_SMI_PATTERN: GPU 0's utilisation, line after line (GPU 1 is always at 50 %),
# FAKE_SMI_COUNT rounds then silence; FAKE_SMI_STATE: a file whose word ("wait" or "compute") sets
# GPU 0 at 0 % or 95 %; FAKE_SMI_APPS: "pid, uuid" lines separated by ";"; FAKE_SMI_FAIL: a message
# printed before exiting with status 6, as nvidia-smi does on a machine without a device.
FAKE_SMI = """\
import os, sys, time
args = sys.argv[1:]
env = os.environ
if env.get("FAKE_SMI_FAIL"):
    print(env["FAKE_SMI_FAIL"], flush=True)
    sys.exit(6)
if any(a.startswith("--query-compute-apps=pid,gpu_uuid") for a in args):
    for line in env.get("FAKE_SMI_APPS", "").split(";"):
        if line:
            print(line)
    sys.exit(0)
if "--query-gpu=index,uuid" in args:
    print("0, GPU-aaaa-0000")
    print("1, GPU-bbbb-1111")
    sys.exit(0)
assert "--query-gpu=index,utilization.gpu,memory.used" in args, args
assert "--format=csv,noheader,nounits" in args, args
interval = int(args[args.index("-lms") + 1]) / 1000
pattern = [int(v) for v in env.get("FAKE_SMI_PATTERN", "0,95").split(",")]
count = int(env.get("FAKE_SMI_COUNT", "0"))
state = env.get("FAKE_SMI_STATE")
i = 0
while not count or i < count:
    if state:
        with open(state) as f:
            util = 0 if f.read().strip() == "wait" else 95
    else:
        util = pattern[i % len(pattern)]
    print(f"0, {util}, {1000 + i}", flush=True)
    print(f"1, 50, 200", flush=True)
    i += 1
    time.sleep(interval)
time.sleep(600)
"""


def write_fake_nvidia_smi(bin_dir) -> str:
    """An executable ``nvidia-smi`` (FAKE_SMI) in ``bin_dir``, which is returned."""
    os.makedirs(bin_dir, exist_ok=True)
    exe = os.path.join(bin_dir, "nvidia-smi")
    with open(exe, "w") as f:
        f.write(f"#!{sys.executable}\n{FAKE_SMI}")
    os.chmod(exe, 0o755)
    return bin_dir


# --- moto's S3 server on 127.0.0.1 (remote storage tests) ---------------------------------

from tests.support import s3server  # noqa: E402  (the standard library only: moto runs in its own process)


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server: the tests that use it (through ``s3``) are skipped without s3fs or
    moto[server], not the others in this file."""
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'dsconvert[s3]')")
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    saved = {k: os.environ.get(k) for k in s3server.CREDENTIALS}
    os.environ.update(s3server.CREDENTIALS)
    proc, endpoint = s3server.start()
    S3.log_path = proc.log_path
    try:
        yield endpoint
    finally:
        s3server.stop(proc)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class S3:
    def __init__(self, endpoint, bucket):
        import s3fs

        self.endpoint = endpoint
        self.options = s3server.storage_options(endpoint)
        self.fs = s3fs.S3FileSystem(**self.options)
        self.bucket = bucket
        self.fs.mkdir(bucket)

    def url(self, key):
        return f"s3://{self.bucket}/{key}"

    def put_tree(self, local, key):
        self.fs.put(local, f"{self.bucket}/{key}", recursive=True)
        self.fs.invalidate_cache()
        return self.url(key)

    def files(self, key):
        self.fs.invalidate_cache()
        base = f"{self.bucket}/{key}"
        return {p[len(base) + 1:]: self.fs.cat_file(p) for p in self.fs.find(base)
                if not p[len(base) + 1:].startswith(".")}  # as local_files: not the output's marker

    log_path = ""  # the server's request log (s3_endpoint sets it)

    def requests(self, key=""):
        """The requests the server has logged so far for objects under ``key`` in this bucket,
        as their request lines ("GET /bucket/key HTTP/1.1")."""
        prefix = f"/{self.bucket}/{key}"
        with open(self.log_path, errors="replace") as f:
            lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in f]
        return [line.split('"')[1] for line in lines if f" {prefix}" in line and line.count('"') >= 2]

    def cli(self):
        return ["--storage-option", f"client_kwargs.endpoint_url={self.endpoint}",
                "--storage-option", "client_kwargs.region_name=eu-west-1"]


@pytest.fixture
def s3(s3_endpoint, request):
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    return S3(s3_endpoint, f"{name}-{uuid.uuid4().hex[:8]}")


