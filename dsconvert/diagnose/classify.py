"""From sampled stacks to a diagnosis: who does what, whether the job is input-bound, why,
and the fixes, in the order to try them. Pure functions of the stacks (no I/O but reading a
leaf frame's source line, which callers can replace), so they are tested on constructed
stacks.

Roles. The *main* thread of the target process runs the training loop; DataLoader
*workers* are its subprocesses running ``torch.utils.data._utils.worker._worker_loop``.

Main thread categories: ``wait`` (in the DataLoader's ``__next__``, waiting for a batch: the
job is starved), ``ipc`` (receiving batches: unpickling tensors from the workers), ``pin``,
data work done in the main process itself (``num_workers=0`` or no DataLoader: the worker
categories below), and ``compute`` (everything else: forward, backward, optimizer, waiting
for the GPU). Following the seed's rule of thumb, a main thread that spends 30 % or more of
its time getting data is input-bound; without workers, 15 % of loading of its own is enough
(``NO_WORKERS_SHARE``: that loading is never overlapped with the step).

Worker categories: ``decode`` (Pillow, PyTurboJPEG, simplejpeg, OpenCV, torchvision.io),
``read`` (file reads, ``Image.open``, ``np.load``/``np.fromfile``, h5py, tar), ``remote``
(sockets, HTTP, S3, fsspec), ``unpickle``, ``augment`` (preprocessing, see below),
``collate``, ``ipc`` (sending batches), ``dataset`` (the dataset's own Python: indexing,
parsing, paths), ``idle`` (waiting for work). C calls are invisible to py-spy, so the leaf
frame's source line is read too (``np.fromfile(...)``, ``cv2.imdecode(...)``, ``f.read()``).

Where the dataset runs. The *dataset part* of a stack is what runs below the fetcher
(``torch/utils/data/_utils/fetch.py``: in a worker, or in the main thread below
``_SingleProcessDataLoaderIter``), or, in a training loop without a DataLoader, below the
dataset's ``__getitem__``. There a sample is read, decoded and then transformed, and a stack
of the dataset part is sorted by *where* its time goes, not by which library spends it:

1. the leaf-most frame that a rule knows as reading, decoding, unpickling, remote storage,
   collation or IPC (or the leaf's source line calling such a C function) names those;
2. any other work is *preprocessing* (``augment``) when the stack passes through a transform
   call: a frame whose function name contains ``transform`` or ``augment``, a callable
   object's ``__call__``, an ``nn.Module`` called (``_call_impl``/``forward``), or a frame of
   an array or image library doing compute (numpy, torch and torchvision, scipy, OpenCV,
   scikit-image, kornia, albumentations, imgaug, MONAI, Pillow's transforms), or when the
   leaf's line calls one (``cv2.GaussianBlur(...)``, ``torch.flip(...)``, ``np.clip(...)``);
   a Pillow conversion to RGB or to an array inside a transform (``ToTensor``) is
   preprocessing too, while the decode Pillow does lazily there stays ``decode``;
3. what remains is the dataset's own Python code, ``dataset``.

So a blur in ``scipy.ndimage``, a rotation in OpenCV, a custom ``Jitter.__call__`` doing numpy
arithmetic and a torch op are all ``augment``; its time is on-CPU compute, not waiting.

Off-CPU time (from the recording without ``--idle``) inside decode or unpickle is time spent
waiting for the file's bytes (Pillow and pickle read lazily), so it is counted as ``read``.

Verdicts. With workers, the bottleneck is the workers' largest category, or ``ipc`` when the
workers are mostly idle, or when the loop spends more time receiving batches than waiting for
them and that receiving takes at least the CPU the workers' largest loading category takes (all
workers together: per-file loading in two workers can outweigh the hand-over, and is then what
the fix removes; both CPU figures are in the evidence); a loop that spends ``IPC_SHARE``
(20 %) or more receiving batches gets the IPC finding and fixes even when IPC is not the
bottleneck. Without workers, a loop that loads its own
data is ``no-workers``: the first fix is ``DataLoader(..., num_workers=N)`` with N the CPUs
available, then what the workers would still be bound by (``bound_by``: the category of the
main thread's data work). A ``dsconvert shard`` command is suggested only for a dataset
folder that was seen open and that ``dsconvert shard`` accepts for that format
(``shard_formats``, from the real scanner); otherwise the fix is given as a code change.

The rules are data, each table in its module: what a frame does (:mod:`.rules`), the verdict
and bottleneck (:mod:`.verdicts`), the fixes per bottleneck (:mod:`.fixes`, whose ``dsconvert
shard`` commands :mod:`dsconvert.advice` builds, as for ``dsconvert analyze``). This module
classifies stacks with them and puts the diagnosis together.
"""

from __future__ import annotations

import linecache
import re
import shlex
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .fixes import Fixes, apply_fixes, worker_fixes
from .pyspy import Frame, Stack
from .rules import (
    COMPUTE_LIBRARIES,
    COMPUTE_LINES,
    COMPUTE_RULES,
    FRAME_RULES,
    LINE_RULES,
    FrameRule,
    LineRule,
)
from .verdicts import INPUT_BOUND_SHARE, NO_WORKERS_SHARE, Measured, decide

__all__ = ["classify_stack", "diagnose_stacks", "Diagnosis", "INPUT_BOUND_SHARE", "NO_WORKERS_SHARE", "IPC_SHARE",
           "DATA_CATEGORIES", "worker_pids"]

IPC_SHARE = 0.20  # the loop's time receiving batches from which IPC is a finding
DATA_CATEGORIES = ("decode", "read", "remote", "unpickle", "augment", "collate", "dataset", "ipc")
LAZY_READERS = ("decode", "unpickle")  # categories whose off-CPU time is a file read

LineReader = Callable[[str, int], str]

_TRANSFORM_NAME = re.compile(r"transform|augment", re.IGNORECASE)
_MODULE_FILE = "torch/nn/modules/module.py"
_PIL_TO_ARRAY = "Pillow (to RGB / array)"


def _source_line(file: str, line: int) -> str:
    return linecache.getline(file, line).strip() if file and line else ""


def _path(frame: Frame) -> str:
    return frame.file.replace("\\", "/")


def _first(rules: Sequence[FrameRule], file: str, func: str) -> Optional[FrameRule]:
    """The first rule of the table that a frame of ``file`` running ``func`` matches."""
    return next((r for r in rules if r.matches(file, func)), None)


def _first_line(rules: Sequence[LineRule], line: str) -> Optional[LineRule]:
    """The first rule of the table that a source line matches."""
    return next((r for r in rules if r.matches(line)), None)


def _match(frames: Sequence[Frame], read_line: LineReader) -> Optional[Tuple[int, str, str]]:
    """(index, category, detail) of the leaf-most frame a rule knows, or None."""
    for depth, frame in enumerate(reversed(frames)):
        file = _path(frame)
        rule = _first(FRAME_RULES, file, frame.func)
        if rule:
            return len(frames) - 1 - depth, rule.category, rule.detail
        if depth == 0:  # the leaf: what C function does its line call?
            line = _first_line(LINE_RULES, read_line(frame.file, frame.line))
            if line:
                return len(frames) - 1, line.category, line.detail
    return None


def _data_rule(frames: Sequence[Frame], read_line: LineReader) -> Optional[Tuple[str, str]]:
    """(category, detail) of the leaf-most frame a rule knows, or None."""
    found = _match(frames, read_line)
    return found[1:] if found else None


def _transform_call(frames: Sequence[Frame]) -> Optional[int]:
    """Index of the outermost transform call in the dataset part of a stack, or None: a function
    named *transform*/*augment*, a callable object's ``__call__``, an ``nn.Module`` called."""
    for i, frame in enumerate(frames):
        func = frame.func.rsplit(".", 1)[-1]  # the function's own name, not its class's
        if (_TRANSFORM_NAME.search(func) and func not in ("__getitem__", "__getitems__")) or func == "__call__" or \
                (func in ("_call_impl", "_wrapped_call_impl", "forward") and _path(frame).endswith(_MODULE_FILE)):
            return i
    return None


def _compute_library(frames: Sequence[Frame], read_line: LineReader) -> Optional[str]:
    """The array/image library doing compute: the outermost frame of one (the call the dataset
    made: scipy.ndimage rather than the numpy it calls), else what the leaf's line calls."""
    for frame in frames:
        file = _path(frame)
        rule = _first(COMPUTE_LIBRARIES, file, frame.func)
        if rule:
            return rule.detail
    if frames:
        line = _first_line(COMPUTE_LINES, read_line(frames[-1].file, frames[-1].line))
        if line:
            return line.detail
    return None


def _dataset_part(frames: Sequence[Frame], read_line: LineReader) -> Tuple[str, str]:
    """Category of a stack's dataset part (below the fetcher or the dataset's __getitem__);
    see "Where the dataset runs" in the module doc."""
    found = _match(frames, read_line)
    transform = _transform_call(frames)
    if found:
        index, category, detail = found
        if detail == _PIL_TO_ARRAY and transform is not None and transform < index:
            return "augment", "Pillow (to array / tensor)"
        return category, detail
    library = _compute_library(frames, read_line)
    if library:
        return "augment", library
    if transform is not None:
        return "augment", f"custom transform ({frames[transform].func})"
    return "dataset", "dataset code (Python)"


def _index(frames: Sequence[Frame], func_suffix: str, file_suffix: str) -> Optional[int]:
    for i, f in enumerate(frames):
        if f.func.endswith(func_suffix) and _path(f).endswith(file_suffix):
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
_WAIT = "waiting for a batch from the workers"


def _fetched(frames: Sequence[Frame], read_line: LineReader) -> Optional[Tuple[str, str]]:
    """Category of a stack below the DataLoader's fetcher (a worker's, or the main thread's
    with num_workers=0), or None when it is not in the fetcher."""
    fetch = next((i for i, f in enumerate(frames) if _path(f).endswith(_FETCH_FILE)), None)
    if fetch is None:
        return None
    return _dataset_part(frames[fetch + 1:], read_line)


def _getitem(frames: Sequence[Frame]) -> Optional[int]:
    """The outermost dataset ``__getitem__`` called by a training loop without a DataLoader."""
    for i, f in enumerate(frames):
        if f.func.endswith(("__getitem__", "__getitems__")) and "torch/nn/" not in _path(f):
            return i
    return None


def _main(frames: Sequence[Frame], read_line: LineReader) -> Tuple[str, str]:
    loader = [f for f in frames if _path(f).endswith(_LOADER_FILE)]
    if any(f.func.endswith(("__iter__", "_shutdown_workers", "_get_iterator")) for f in loader):
        return "wait", _RESTART
    nxt = _index(frames, "__next__", _LOADER_FILE)
    if nxt is not None:
        below = frames[nxt + 1:]
        if any("_SingleProcessDataLoaderIter" in f.func for f in below):  # num_workers=0
            return _fetched(below, read_line) or _data_rule(below, read_line) or ("dataset", "dataset code (Python)")
        rule = _data_rule(below, read_line)
        if rule and rule[0] in ("ipc", "pin", "collate"):
            return rule
        return "wait", _WAIT
    item = _getitem(frames)
    if item is not None:  # the loop indexes its dataset itself
        return _dataset_part(frames[item + 1:], read_line)
    rule = _data_rule(frames, read_line)
    if rule and rule[0] in DATA_CATEGORIES and rule[0] != "ipc":
        return rule  # data work in the training loop itself
    for compute in COMPUTE_RULES:  # the first rule any frame matches, leaf-most frame first
        if any(compute.matches(_path(frame), frame.func) for frame in reversed(frames)):
            return "compute", compute.detail
    return "compute", "training loop (Python)"


def _worker(frames: Sequence[Frame], read_line: LineReader) -> Tuple[str, str]:
    loop = _index(frames, "_worker_loop", _LOOP_FILE)
    below = frames[loop + 1:] if loop is not None else frames
    fetched = _fetched(below, read_line)
    if fetched is not None:
        return fetched
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
    fixes: List[str] = field(default_factory=list)  # in the order to try: commands and code changes
    bound_by: Optional[str] = None  # no-workers: what the main thread's data work is
    receive_share: float = 0.0  # the loop's time receiving batches from workers (ipc, pin, collate)

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


_NAMES = {"decode": "image decode", "read": "file reads", "remote": "remote storage reads",
          "unpickle": "unpickling", "augment": "augmentation (preprocessing)", "collate": "collation",
          "ipc": "moving batches between processes", "dataset": "the dataset's Python code"}


def diagnose_stacks(wall_stacks: Sequence[Stack], cpu_stacks: Sequence[Stack], target: int, cpus: int,
                    data_root: Optional[str] = None, fast_decoder: Optional[str] = None,
                    read_line: LineReader = _source_line,
                    shard_formats: Optional[Sequence[str]] = (),
                    on_cpu: Optional[Mapping[int, float]] = None) -> Diagnosis:
    """Aggregate both recordings and decide; see the module doc. ``shard_formats``: the formats
    ``dsconvert shard`` accepts ``data_root`` for (checked by the caller with the scanner; None
    when that check could not finish); a conversion command is suggested only for those.
    ``on_cpu``: per process, the share of its main thread's active time spent on a CPU rather
    than waiting for one (:func:`dsconvert.schedstat.on_cpu_shares`; missing: 1.0), so that the
    CPU the ipc rule compares is the work's, not the machine's load."""
    workers = worker_pids(wall_stacks)
    memo: Dict[Tuple[int, int, str, Tuple[Frame, ...]], Tuple[str, str, str]] = {}

    def classify(stack: Stack) -> Tuple[str, str, str]:
        key = (stack.pid, stack.thread_id, stack.thread, stack.frames)
        if key not in memo:
            got = classify_stack(stack, target, workers, read_line)
            if not workers and got[:2] == ("main", "wait"):  # the DataLoader's own code, in the loop
                got = ("main", "dataset", "DataLoader (sampler, fetcher)")
            memo[key] = got
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
    # receiving batches from workers: unpickling their tensors, pinning, collating in the main process
    receiving = ("ipc", "pin", "collate") if workers else ("ipc", "pin")
    receive = sum(main.get(k, {}).get("share", 0.0) for k in receiving)

    wait = main.get("wait", {}).get("share", 0.0)
    in_main = {k: v["share"] for k, v in main.items() if k in DATA_CATEGORIES}
    own = {k: v for k, v in in_main.items() if k not in receiving}  # data work the main thread does itself
    pool = {k: v["share"] for k, v in work.items() if k in DATA_CATEGORIES} if workers else {}
    for k, v in own.items():
        pool[k] = pool.get(k, 0.0) + v
    # CPU, in CPUs: the workers' largest loading category (all of them together) and the loop's receiving
    # py-spy's active samples hold the time a thread was ready but waited for a CPU: taken out
    shares = on_cpu or {}
    worker_on_cpu = sum(shares.get(w, 1.0) for w in workers) / len(workers) if workers else 1.0
    loading = {k: v["share"] * v["cpu_share"] * len(workers) * worker_on_cpu for k, v in work.items()
               if k in DATA_CATEGORIES and k not in ("ipc", "collate")} if workers else {}
    loading_key = max(loading, key=loading.__getitem__) if loading else None
    loading_cpu = loading[loading_key] if loading_key else 0.0
    receive_cpu = shares.get(target, 1.0) * sum(main.get(k, {}).get("share", 0.0) * main.get(k, {}).get(
        "cpu_share", 0.0) for k in receiving)
    verdict, bottleneck = decide(Measured(n_main, input_share, own, len(workers), worker_busy, receive, wait, pool,
                                          loading_cpu, receive_cpu))
    evidence: List[str] = []
    if verdict == "unknown":
        return Diagnosis("unknown", None, "too few samples of the training loop's main thread to decide; "
                         "sample longer (--duration) once training has started", evidence, [], [], main, work,
                         worker_busy, input_share, len(workers), dict(samples), top, receive_share=receive)
    parts = ([f"{wait:.0%} waiting for the workers"] if workers else []) + \
        [f"{v:.0%} {k}" for k, v in in_main.items() if v >= 0.01]
    evidence.append(f"main thread: {input_share:.0%} getting data ({', '.join(parts) or 'none'}), "
                    f"{main.get('compute', {}).get('share', 0.0):.0%} computing")
    if workers:
        busy = ", ".join(f"{k} {v['share']:.0%}" for k, v in work.items() if k != "idle" and v["share"] >= 0.02)
        evidence.append(f"{len(workers)} DataLoader worker(s), busy {worker_busy:.0%} of the time: {busy or 'nothing'}")
    else:
        evidence.append("no DataLoader worker processes: the main process loads its own data (num_workers=0)")
    ipc_finding = bool(workers) and receive >= IPC_SHARE
    if loading_key and receive > 0:  # the two CPU figures the ipc rule compares, both said
        evidence.append(f"CPU: the workers' {_NAMES.get(loading_key, loading_key)} {loading_cpu:.2f} CPUs, the "
                        f"training loop's receiving of batches {receive_cpu:.2f} CPUs"
                        + (" (time ready but waiting for a CPU taken out)" if on_cpu else "") + ": "
                        + ("loading is the larger" if loading_cpu > receive_cpu else "receiving is the larger"))
    if ipc_finding:
        received: Dict[str, float] = {}
        for k in receiving:
            for d, share in main.get(k, {}).get("details", {}).items():
                received[d] = received.get(d, 0.0) + share
        evidence.append(f"the training loop spends {receive:.0%} of its time receiving batches from the workers ("
                        + ", ".join(f"{d} {v:.0%}" for d, v in sorted(received.items(), key=lambda kv: -kv[1])
                                    if v >= 0.01)
                        + ")")

    # what the main thread's own data work is, when it loads without workers
    bound_by: Optional[str] = max(own, key=own.__getitem__) if bottleneck == "no-workers" else None
    if verdict == "input-bound":
        assert bottleneck is not None  # every input-bound rule of VERDICTS names one
        category = bound_by or bottleneck
        details: Dict[str, float] = {}
        for table in ((main,) if bound_by else (work, main)):
            for k in (receiving if category == "ipc" else (category,)):
                for d, share in table.get(k, {}).get("details", {}).items():
                    details[d] = details.get(d, 0.0) + share
        top_detail = max(details, key=details.__getitem__) if details else category
        if bound_by:
            summary = (f"input-bound: no DataLoader workers (num_workers=0 or no DataLoader), so loading runs in "
                       f"the training loop itself, {sum(own.values()):.0%} of its time, mostly "
                       f"{_NAMES.get(bound_by, bound_by)} ({top_detail})")
        else:
            summary = (f"input-bound: the training loop waits for data {input_share:.0%} of the time; the loaders' "
                       f"time goes mostly to {_NAMES.get(bottleneck, bottleneck)} ({top_detail})")
    else:
        details = {}
        compute = main.get("compute", {})
        top_detail = max(compute.get("details", {"the model": 1}).items(), key=lambda kv: kv[1])[0]
        summary = (f"compute-bound: the input pipeline keeps up (the training loop waits for data "
                   f"{input_share:.0%} of the time); most time goes to {top_detail}")
    if ipc_finding and bottleneck != "ipc":
        summary += f"; the loop also spends {receive:.0%} of its time receiving batches from the workers"

    fx = Fixes(data_root, shard_formats)
    if bottleneck:
        worker_fixes(bottleneck, fx, len(workers), cpus, worker_busy)
        apply_fixes(bound_by or bottleneck, fx, details, fast_decoder)
    if ipc_finding and bottleneck != "ipc":
        apply_fixes("ipc", fx, {}, fast_decoder)
    restart = main.get("wait", {}).get("details", {}).get(_RESTART, 0.0)
    if restart >= 0.05:
        fx.note(f"{restart:.0%} of the loop's time goes to {_RESTART} at epoch boundaries: "
                "DataLoader(..., persistent_workers=True) keeps them")
    if bottleneck and data_root is None:
        fx.note("no data files were seen open (data in memory, or read in a way /proc does not show), "
                "so no dsconvert command is suggested")
    if fx.refused and fx.unchecked:
        fx.note(f"{data_root} could not be scanned in time to check which formats `dsconvert shard` takes it "
                "for, so those fixes are given as code changes")
    for fmt in fx.refused if not fx.unchecked else ():
        fx.note(f"`dsconvert shard` does not take {data_root} as a source for --format {fmt}, so that fix "
                "is given as a code change")
    if data_root and bottleneck:
        fx.note(f"`dsconvert analyze {shlex.quote(data_root)}` measures the data at rest and predicts each "
                "format's rate")
    return Diagnosis(verdict, bottleneck, summary, evidence, fx.commands, fx.notes, main, work, worker_busy,
                     input_share, len(workers), dict(samples), top, fixes=fx.fixes, bound_by=bound_by,
                     receive_share=receive)
