"""From sampled stacks to a diagnosis: who does what, whether the job is input-bound, why,
and the dsconvert command that fixes it. Pure functions of the stacks (no I/O but reading
a leaf frame's source line, which callers can replace), so they are tested on constructed
stacks.

Roles. The *main* thread of the target process runs the training loop; DataLoader
*workers* are its subprocesses running ``torch.utils.data._utils.worker._worker_loop``.

Main thread categories: ``wait`` (in the DataLoader's ``__next__``, waiting for a batch: the
job is starved), ``ipc`` (receiving batches: unpickling tensors from the workers), ``pin``,
data work done in the main process itself (``num_workers=0`` or no DataLoader: the worker
categories below), and ``compute`` (everything else: forward, backward, optimizer, waiting
for the GPU). Following the seed's rule of thumb, a main thread that spends 30 % or more of
its time getting data is input-bound.

Worker categories: ``decode`` (Pillow, PyTurboJPEG, simplejpeg, OpenCV, torchvision.io),
``read`` (file reads, ``Image.open``, ``np.load``/``np.fromfile``, h5py, tar), ``remote``
(sockets, HTTP, S3, fsspec), ``unpickle``, ``augment`` (Pillow/torchvision/albumentations
transforms), ``collate``, ``ipc`` (sending batches), ``dataset`` (other Python code of the
dataset), ``idle`` (waiting for work). A stack's category is decided by its leaf-most frame
that a rule knows; C calls are invisible to py-spy, so the leaf frame's source line is read
too (``np.fromfile(...)``, ``cv2.imdecode(...)``, ``f.read()``).

Off-CPU time (from the recording without ``--idle``) inside decode or unpickle is time spent
waiting for the file's bytes (Pillow and pickle read lazily), so it is counted as ``read``.
"""

from __future__ import annotations

import linecache
import re
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from .pyspy import Frame, Stack

__all__ = ["classify_stack", "diagnose_stacks", "Diagnosis", "INPUT_BOUND_SHARE", "DATA_CATEGORIES",
           "worker_pids"]

INPUT_BOUND_SHARE = 0.30
DATA_CATEGORIES = ("decode", "read", "remote", "unpickle", "augment", "collate", "dataset", "ipc")
LAZY_READERS = ("decode", "unpickle")  # categories whose off-CPU time is a file read

LineReader = Callable[[str, int], str]

# (category, detail, file pattern, function pattern or None), checked leaf-most frame first
_RULES: List[Tuple[str, str, "re.Pattern[str]", Optional["re.Pattern[str]"]]] = [
    (c, d, re.compile(f), re.compile(fn) if fn else None) for c, d, f, fn in (
        ("ipc", "unpickling tensors from workers", r"torch/multiprocessing/reductions\.py$", r"rebuild"),
        ("ipc", "pickling tensors for the main process", r"torch/multiprocessing/reductions\.py$", None),
        ("unpickle", "pickle.load", r"(^|/)pickle\.py$", r"load|Unpickler"),
        ("unpickle", "torch.load", r"torch/serialization\.py$", r"load"),
        ("decode", "PyTurboJPEG", r"(^|/)turbojpeg\.py$", None),
        ("decode", "simplejpeg", r"simplejpeg", None),
        ("decode", "torchvision.io", r"torchvision/io/", None),
        ("decode", "PNG (Pillow)", r"PIL/PngImagePlugin\.py$", r"load|chunk|read"),
        ("decode", "JPEG (Pillow)", r"PIL/JpegImagePlugin\.py$", r"load_read|draft|load_prepare"),
        ("read", "Image.open (open + header)", r"PIL/Image\.py$", r"^open$|_open_core|^_open$"),
        ("read", "Image.open (open + header)", r"PIL/\w+ImagePlugin\.py$", r"_open|factory|__init__"),
        ("read", "Image.open (open + header)", r"PIL/ImageFile\.py$", r"__init__"),
        ("decode", "Pillow", r"PIL/ImageFile\.py$", r"load"),
        ("decode", "Pillow (to RGB / array)", r"PIL/Image\.py$",
         r"^(Image\.)?(convert|tobytes|__array_interface__|copy|load|frombuffer|_new|_copy_info)"),
        ("augment", "Pillow transforms", r"PIL/(Image|ImageOps|ImageEnhance|ImageFilter|ImageTransform)\.py$", None),
        ("augment", "torchvision transforms", r"torchvision/transforms/", None),
        ("augment", "albumentations", r"albumentations/", None),
        ("read", "np.load", r"numpy/lib/(npyio|_npyio_impl|format|_format_impl)\.py$", None),
        ("read", "np.memmap", r"numpy/(core|_core)/memmap\.py$", None),
        ("read", "h5py", r"h5py/", None),
        ("read", "tarfile", r"(^|/)tarfile\.py$", None),
        ("read", "webdataset", r"webdataset/", None),
        ("read", "dsconvert shards", r"dsconvert/(formats|readers|io)/", None),
        ("decode", "dsconvert (Pillow/turbojpeg chain)", r"dsconvert/codecs\.py$", r"decode|_pil"),
        ("remote", "S3 (s3fs/botocore)", r"(s3fs|botocore|boto3|aiobotocore)/", None),
        ("remote", "HTTP", r"(urllib3|requests|aiohttp|httpx)/|http/client\.py$|fsspec/implementations/http", None),
        ("remote", "GCS / Azure", r"(gcsfs|adlfs|google/cloud/storage)/", None),
        ("read", "fsspec (local files)", r"fsspec/implementations/(local|cached)\.py$", None),
        ("remote", "fsspec", r"fsspec/", None),
        ("remote", "socket", r"(^|/)(socket|ssl|selectors)\.py$", None),
        ("collate", "default_collate", r"torch/utils/data/_utils/collate\.py$", None),
        ("pin", "pin memory", r"torch/utils/data/_utils/pin_memory\.py$", None),
    )
]

# what the leaf frame's source line calls (C functions py-spy does not see)
_LINE_RULES: List[Tuple[str, str, "re.Pattern[str]"]] = [
    (c, d, re.compile(p)) for c, d, p in (
        ("read", "np.fromfile", r"\bfromfile\("),
        ("decode", "OpenCV", r"\bcv2\.(imdecode|imread)\("),
        ("augment", "OpenCV transforms", r"\bcv2\.(resize|warpAffine|warpPerspective|cvtColor|GaussianBlur|flip)\("),
        ("unpickle", "pickle.load", r"\b(pickle|cPickle|_pickle)\.loads?\(|\bloads?\(.*pickle"),
        ("remote", "socket recv", r"\.recv(_into|from)?\("),
        ("read", "file read", r"\.(read|readinto|readline|readlines)\(|\bopen\(|\bos\.(pread|read)\("),
    )
]

_COMPUTE: List[Tuple[str, "re.Pattern[str]", Optional["re.Pattern[str]"]]] = [
    (d, re.compile(f), re.compile(fn) if fn else None) for d, f, fn in (
        ("waiting for the GPU (synchronize)", r"torch/cuda/", r"synchronize"),
        ("backward", r"torch/autograd/|torch/_tensor\.py$", r"backward|_engine_run_backward|run_backward"),
        ("optimizer step", r"torch/optim/", None),
        ("model forward", r"torch/nn/modules/", None),
        ("torch (other)", r"torch/", None),
        ("numpy", r"numpy/", None),
    )
]


def _source_line(file: str, line: int) -> str:
    return linecache.getline(file, line).strip() if file and line else ""


def _data_rule(frames: Sequence[Frame], read_line: LineReader) -> Optional[Tuple[str, str]]:
    """(category, detail) of the leaf-most frame a rule knows, or None."""
    for depth, frame in enumerate(reversed(frames)):
        file = frame.file.replace("\\", "/")
        for category, detail, fpat, fnpat in _RULES:
            if fpat.search(file) and (fnpat is None or fnpat.search(frame.func)):
                return category, detail
        if depth == 0:  # the leaf: what C function does its line call?
            text = read_line(frame.file, frame.line)
            for category, detail, pat in _LINE_RULES:
                if pat.search(text):
                    return category, detail
    return None


def _index(frames: Sequence[Frame], func_suffix: str, file_suffix: str) -> Optional[int]:
    for i, f in enumerate(frames):
        if f.func.endswith(func_suffix) and f.file.replace("\\", "/").endswith(file_suffix):
            return i
    return None


_LOOP_FILE = "torch/utils/data/_utils/worker.py"
_FETCH_FILE = "torch/utils/data/_utils/fetch.py"
_LOADER_FILE = "torch/utils/data/dataloader.py"


def worker_pids(stacks: Sequence[Stack]) -> List[int]:
    """Processes whose stacks run the DataLoader worker loop."""
    return sorted({s.pid for s in stacks if _index(s.frames, "_worker_loop", _LOOP_FILE) is not None})


def _is_main_thread(stack: Stack) -> bool:
    if stack.thread:
        return stack.thread == "MainThread"
    return bool(stack.frames) and stack.frames[0].func == "<module>"


_RESTART = "starting or stopping DataLoader workers"


def _main(frames: Sequence[Frame], read_line: LineReader) -> Tuple[str, str]:
    loader = [f for f in frames if f.file.replace("\\", "/").endswith(_LOADER_FILE)]
    if any(f.func.endswith(("__iter__", "_shutdown_workers", "_get_iterator")) for f in loader):
        return "wait", _RESTART
    nxt = _index(frames, "__next__", _LOADER_FILE)
    if nxt is not None:
        below = frames[nxt + 1:]
        if any("_SingleProcessDataLoaderIter" in f.func for f in below):
            return _data_rule(below, read_line) or ("dataset", "dataset code (Python)")
        rule = _data_rule(below, read_line)
        if rule and rule[0] in ("ipc", "pin"):
            return rule
        return "wait", "waiting for a batch from the workers"
    rule = _data_rule(frames, read_line)
    if rule and rule[0] in DATA_CATEGORIES and rule[0] != "ipc":
        return rule  # data work in the training loop itself
    for detail, fpat, fnpat in _COMPUTE:
        for frame in reversed(frames):
            if fpat.search(frame.file.replace("\\", "/")) and (fnpat is None or fnpat.search(frame.func)):
                return "compute", detail
    return "compute", "training loop (Python)"


def _worker(frames: Sequence[Frame], read_line: LineReader) -> Tuple[str, str]:
    loop = _index(frames, "_worker_loop", _LOOP_FILE)
    below = frames[loop + 1:] if loop is not None else frames
    fetch = next((i for i, f in enumerate(below) if f.file.replace("\\", "/").endswith(_FETCH_FILE)), None)
    if fetch is not None:
        return _data_rule(below[fetch + 1:], read_line) or ("dataset", "dataset code (Python)")
    rule = _data_rule(below, read_line)
    if rule and rule[0] == "ipc":
        return rule
    return "idle", "waiting for work"


def _helper_thread(frames: Sequence[Frame]) -> Tuple[str, str]:
    """Queue feeder threads pickle what a worker sends; other helper threads wait."""
    files = " ".join(f.file for f in frames)
    funcs = " ".join(f.func for f in frames)
    if "reductions.py" in files or re.search(r"dumps|_send_bytes|send_bytes", funcs):
        return "ipc", "pickling batches for the main process"
    if "pin_memory.py" in files and not frames[-1].func.endswith(("get", "wait", "_wait")):
        return "pin", "pin memory"
    return "idle", "helper thread"


def classify_stack(stack: Stack, target: int, workers: Sequence[int],
                   read_line: LineReader = _source_line) -> Tuple[str, str, str]:
    """(role, category, detail) of one stack; roles: main, main-thread, worker, worker-thread, other."""
    main_thread = _is_main_thread(stack)
    if stack.pid == target:
        if main_thread:
            return ("main",) + _main(stack.frames, read_line)
        return ("main-thread",) + _helper_thread(stack.frames)
    if stack.pid in workers:
        if main_thread:
            return ("worker",) + _worker(stack.frames, read_line)
        return ("worker-thread",) + _helper_thread(stack.frames)
    if not main_thread:
        return ("other",) + _helper_thread(stack.frames)
    return ("other",) + (_data_rule(stack.frames, read_line) or ("idle", "other process"))


@dataclass
class Diagnosis:
    verdict: str  # input-bound | compute-bound | unknown
    bottleneck: Optional[str]
    summary: str
    evidence: List[str]
    commands: List[str]
    notes: List[str]
    main: Dict[str, Dict[str, float]]  # category -> {share, cpu_share, details{detail: share}}
    workers: Dict[str, Dict[str, float]]
    worker_busy_share: float
    input_share: float
    num_workers: int
    samples: Dict[str, int]
    top_stacks: List[Dict[str, object]] = field(default_factory=list)

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)


def _shares(wall: Dict[Tuple[str, str], float], cpu: Dict[Tuple[str, str], float]) -> Dict[str, Dict]:
    total = sum(wall.values())
    out: Dict[str, Dict] = {}
    for (category, detail), n in sorted(wall.items(), key=lambda kv: -kv[1]):
        entry = out.setdefault(category, {"share": 0.0, "cpu_share": 0.0, "details": {}, "_wall": 0.0, "_cpu": 0.0})
        entry["share"] += n / total if total else 0.0
        entry["details"][detail] = entry["details"].get(detail, 0.0) + (n / total if total else 0.0)
        entry["_wall"] += n
        entry["_cpu"] += cpu.get((category, detail), 0.0)
    for entry in out.values():
        entry["cpu_share"] = min(1.0, entry.pop("_cpu") / entry.pop("_wall")) if entry["share"] else 0.0
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["share"]))


def _move_off_cpu_reads(wall: Dict[Tuple[str, str], float], cpu: Dict[Tuple[str, str], float]) -> None:
    """Off-CPU time inside lazy readers (Pillow's load, pickle.load) waited for file bytes."""
    for (category, detail), n in list(wall.items()):
        if category in LAZY_READERS:
            on = min(n, cpu.get((category, detail), 0.0))
            off = n - on
            if off > 0:
                wall[(category, detail)] = on
                key = ("read", f"file reads inside {detail}")
                wall[key] = wall.get(key, 0.0) + off
                cpu[(category, detail)] = on


def _fixes(bottleneck: str, src: str, details: Dict[str, float], fast_decoder: Optional[str],
           num_workers: int, cpus: int, worker_busy: float) -> Tuple[List[str], List[str]]:
    commands: List[str] = []
    notes: List[str] = []
    more_workers = num_workers < cpus
    if bottleneck == "decode":
        commands.append(f"dsconvert shard {src} --format npy -o OUT --resize 256   # decoded once; "
                        "training reads pixels from a memory map")
        pillow = any("Pillow" in d for d in details)
        if pillow and fast_decoder and fast_decoder != "pil":
            commands.append(f"dsconvert shard {src} --format wds -o OUT   # then open_dataset(OUT, decode=\"numpy\") "
                            f"decodes JPEGs with {fast_decoder}")
        elif pillow:
            notes.append("a faster JPEG decoder: apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'")
    elif bottleneck == "read":
        commands.append(f"dsconvert shard {src} --format wds -o OUT   # many small reads become few large sequential ones")
    elif bottleneck == "remote":
        commands.append(f"dsconvert shard {src} --format wds -o /local/ssd/OUT   # the conversion is also the pre-cache "
                        "to local SSD")
        notes.append("or keep the shards in the object store and read them through a verified local copy: "
                     "dsconvert shard SRC -o s3://.../train-wds, then open_dataset(URL, cache_dir=\"/local/ssd/cache\") "
                     "(dsconvert cache URL /local/ssd/cache fetches them ahead)")
    elif bottleneck == "unpickle":
        commands.append(f"dsconvert shard {src} --format npy -o OUT   # arrays in a memory map, never unpickled")
        notes.append("pickled samples: store arrays with np.save instead; dsconvert never unpickles data")
    elif bottleneck == "augment":
        notes.append("move augmentation to the GPU (torchvision.transforms.v2 on CUDA tensors, kornia, NVIDIA DALI)")
        commands.append(f"dsconvert shard {src} --format npy -o OUT --resize 256   # fixed resizing done once, "
                        "not every epoch")
    elif bottleneck in ("ipc", "collate"):
        notes.append("return uint8 tensors from the dataset and convert to float on the GPU (4x less to "
                     "pickle and copy); pin_memory=True; persistent_workers=True")
    elif bottleneck == "dataset":
        notes.append("the time goes to the dataset's own Python code: profile __getitem__ "
                     "(py-spy record --subprocesses) or move its work into the conversion")
    if more_workers and worker_busy > 0.8 and bottleneck not in ("ipc",):
        notes.append(f"the {num_workers} DataLoader workers are busy {worker_busy:.0%} of the time and "
                     f"{cpus} CPUs are available: num_workers={cpus} helps until the CPUs are saturated")
    if src != "SRC":
        notes.append(f"`dsconvert analyze {src}` measures the data at rest and predicts each format's rate")
    return commands, notes


def diagnose_stacks(wall_stacks: Sequence[Stack], cpu_stacks: Sequence[Stack], target: int, cpus: int,
                    data_root: Optional[str] = None, fast_decoder: Optional[str] = None,
                    read_line: LineReader = _source_line) -> Diagnosis:
    """Aggregate both recordings and decide; see the module doc."""
    workers = worker_pids(wall_stacks)
    memo: Dict[Tuple[int, int, str, Tuple[Frame, ...]], Tuple[str, str, str]] = {}

    def classify(stack: Stack) -> Tuple[str, str, str]:
        key = (stack.pid, stack.thread_id, stack.thread, stack.frames)
        if key not in memo:
            memo[key] = classify_stack(stack, target, workers, read_line)
        return memo[key]

    wall: Dict[str, Dict[Tuple[str, str], float]] = defaultdict(dict)
    cpu: Dict[str, Dict[Tuple[str, str], float]] = defaultdict(dict)
    tops: Counter = Counter()
    samples: Counter = Counter()
    for stacks, into in ((wall_stacks, wall), (cpu_stacks, cpu)):
        for s in stacks:
            role, category, detail = classify(s)
            into[role][(category, detail)] = into[role].get((category, detail), 0.0) + s.count
            if into is wall:
                samples[role] += s.count
                leaf = " > ".join(f"{f.func} ({f.file.rsplit('/', 1)[-1]}:{f.line})" for f in s.frames[-4:])
                tops[(role, category, detail, leaf)] += s.count
    for role in ("main", "worker"):
        _move_off_cpu_reads(wall[role], cpu[role])
    main = _shares(wall["main"], cpu["main"])
    work = _shares(wall["worker"], cpu["worker"])
    n_main = samples["main"]
    input_share = sum(v["share"] for k, v in main.items() if k in ("wait", "pin") or k in DATA_CATEGORIES)
    worker_busy = 1.0 - work.get("idle", {}).get("share", 0.0) if work else 0.0
    top = [{"role": r, "category": c, "detail": d, "share": n / max(1, samples[r]), "frames": leaf}
           for (r, c, d, leaf), n in tops.most_common(40) if r in ("main", "worker")][:10]

    src = data_root or "SRC"
    evidence: List[str] = []
    if n_main < 20:
        return Diagnosis("unknown", None, "too few samples of the training loop's main thread to decide; "
                         "sample longer (--duration) once training has started", evidence, [], [], main, work,
                         worker_busy, input_share, len(workers), dict(samples), top)
    wait = main.get("wait", {}).get("share", 0.0)
    in_main = {k: v["share"] for k, v in main.items() if k in DATA_CATEGORIES}
    evidence.append(f"main thread: {input_share:.0%} getting data ({wait:.0%} waiting for the workers"
                    + "".join(f", {v:.0%} {k}" for k, v in in_main.items() if v >= 0.01)
                    + f"), {main.get('compute', {}).get('share', 0.0):.0%} computing")
    if workers:
        busy = ", ".join(f"{k} {v['share']:.0%}" for k, v in work.items() if k != "idle" and v["share"] >= 0.02)
        evidence.append(f"{len(workers)} DataLoader worker(s), busy {worker_busy:.0%} of the time: {busy or 'nothing'}")
    else:
        evidence.append("no DataLoader worker processes: the main process loads its own data (num_workers=0)")

    if input_share >= INPUT_BOUND_SHARE:
        verdict = "input-bound"
        pool = {k: v["share"] for k, v in work.items() if k in DATA_CATEGORIES} if workers else {}
        for k, v in in_main.items():
            if k != "ipc":
                pool[k] = pool.get(k, 0.0) + v
        if (workers and worker_busy < 0.5) or not pool:
            bottleneck = "ipc"  # workers wait for work while the loop waits for batches: the transfer
        else:
            bottleneck = max(pool, key=pool.get)
        details = {}
        for table in (work, main):
            for d, share in table.get(bottleneck, {}).get("details", {}).items():
                details[d] = details.get(d, 0.0) + share
        top_detail = max(details, key=details.get) if details else bottleneck
        names = {"decode": "image decode", "read": "file reads", "remote": "remote storage reads",
                 "unpickle": "unpickling", "augment": "augmentation", "collate": "collation",
                 "ipc": "moving batches between processes", "dataset": "the dataset's Python code"}
        summary = (f"input-bound: the training loop waits for data {input_share:.0%} of the time; the loaders' "
                   f"time goes mostly to {names.get(bottleneck, bottleneck)} ({top_detail})")
    else:
        verdict = "compute-bound"
        bottleneck = None
        details = {}
        compute = main.get("compute", {})
        top_detail = max(compute.get("details", {"the model": 1}).items(), key=lambda kv: kv[1])[0]
        summary = (f"compute-bound: the input pipeline keeps up (the training loop waits for data "
                   f"{input_share:.0%} of the time); most time goes to {top_detail}")
    commands, notes = _fixes(bottleneck, src, details, fast_decoder, len(workers), cpus, worker_busy) \
        if bottleneck else ([], [])
    restart = main.get("wait", {}).get("details", {}).get(_RESTART, 0.0)
    if restart >= 0.05:
        notes.append(f"{restart:.0%} of the loop's time goes to {_RESTART} at epoch boundaries: "
                     "DataLoader(..., persistent_workers=True) keeps them")
    if data_root is None and bottleneck:
        notes.append("SRC: the dataset folder (no data files were seen open, so it could not be guessed)")
    return Diagnosis(verdict, bottleneck, summary, evidence, commands, notes, main, work, worker_busy,
                     input_share, len(workers), dict(samples), top)
