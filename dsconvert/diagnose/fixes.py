"""The fixes ``dsconvert diagnose`` suggests, as data: for each category a job can be bound by,
the fix records in the order to try them, and one small function that applies them.

A record is a ``dsconvert shard`` conversion (built by :mod:`dsconvert.advice`, as ``dsconvert
analyze`` builds it; given as the code change ``otherwise`` when the data folder is unknown or
``dsconvert shard`` does not take it for that format), a code change, or a plain note. Each may
carry a condition over what was measured (:class:`FixContext`); texts are ``str.format``
templates over the context's fields (``{top}``, ``{fast_decoder}``, ``{wds_out!r}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ..advice import output_for, shard_command

__all__ = ["Fix", "FixContext", "Fixes", "FIXES", "apply_fixes", "worker_fixes"]

SHARD, CHANGE, NOTE = "shard", "change", "note"


@dataclass(frozen=True)
class FixContext:
    """What a fix's condition and text may use."""

    top: str  # the detail the bottleneck's time goes to most ("JPEG (Pillow)", "np.load", ...)
    fast_decoder: Optional[str]  # the fastest JPEG decoder that loads here ("pil" when none is faster)
    pillow: bool  # Pillow decodes (one of the details is Pillow's)
    wds_out: str  # where a conversion to wds writes ("" when the data folder is unknown)
    npy_out: str = ""  # where a conversion to npy writes ("" when the data folder is unknown)

    @property
    def faster_decoder(self) -> bool:
        """A JPEG decoder faster than Pillow loads here."""
        return bool(self.fast_decoder) and self.fast_decoder != "pil"


def _always(ctx: FixContext) -> bool:
    return True


@dataclass(frozen=True)
class Fix:
    """One fix: ``kind`` SHARD (``text`` is the command's comment, ``otherwise`` the code change
    when no command can be suggested), CHANGE (a code change) or NOTE (a remark)."""

    kind: str
    text: str
    fmt: str = ""
    options: Mapping[str, object] = field(default_factory=dict)
    otherwise: Optional[str] = None
    when: Callable[[FixContext], bool] = _always


_IPC = (
    Fix(CHANGE, "return uint8 tensors from the dataset and convert them to float on the GPU: 4x less to pickle "
                "and copy between processes than float32"),
    Fix(CHANGE, "DataLoader(..., pin_memory=True, persistent_workers=True): batches land in pinned memory for "
                "an asynchronous copy to the GPU, and the workers are not restarted every epoch"),
    Fix(CHANGE, "fewer, larger batches, or batch fetching: a dataset __getitems__(indices) that returns one "
                "contiguous batch tensor (with a collate_fn that passes it through) sends one buffer per batch "
                "instead of one per sample"),
)

# category -> its fixes, in the order to try them
FIXES: Dict[str, Tuple[Fix, ...]] = {
    "decode": (
        Fix(SHARD, "decoded and resized once: training reads pixels from a memory map", "npy", {"resize": 256},
            "decode once ahead of training: store the decoded, resized images as arrays with np.save "
            "and read them with np.load(mmap_mode='r')"),
        Fix(SHARD, "then open_dataset({wds_out!r}, decode=\"numpy\") decodes JPEGs with {fast_decoder}", "wds", {},
            "decode JPEGs with {fast_decoder} instead of Pillow (it loads here)",
            when=lambda c: c.pillow and c.faster_decoder),
        Fix(NOTE, "a faster JPEG decoder: apt-get install -y libturbojpeg0 && pip install 'PyTurboJPEG<2'",
            when=lambda c: c.pillow and not c.faster_decoder),
    ),
    "read": (
        # arrays np.load-ed one file a sample: the per-file open, read and header parse go away
        Fix(SHARD, "the arrays packed into one memory-mapped npy cache: no np.load per sample; then "
                   "open_dataset({npy_out!r})", "npy", {},
            "pack the arrays into one memory-mapped array (np.save of them stacked, read with "
            "np.load(path, mmap_mode='r')[i]) instead of one np.load per sample",
            when=lambda c: c.top == "np.load"),
        Fix(SHARD, "many small reads become few large sequential ones", "wds", {},
            "pack the samples into a few large files read sequentially (tar shards, or arrays saved "
            "with np.save and read with np.load(mmap_mode='r')) instead of one small file per sample",
            when=lambda c: c.top != "np.load"),
    ),
    "remote": (
        Fix(SHARD, "with -o on local SSD the conversion is also the pre-cache", "wds", {},
            "copy the data to local SSD before training, packed into a few large files"),
        Fix(NOTE, "or keep the data in the object store as dsconvert shards and read them through a verified "
                  "cache on local SSD: open_dataset(url, cache_dir=...), with `dsconvert cache` to fetch them ahead"),
    ),
    "unpickle": (
        Fix(SHARD, "arrays in a memory map, never unpickled", "npy", {},
            "store the arrays with np.save / np.savez instead of pickle and load them with "
            "np.load(mmap_mode='r'): nothing to unpickle, and only the pages touched are read"),
    ),
    "augment": (
        Fix(SHARD, "when the transforms start with a fixed resize: it is done once here, not every epoch", "npy",
            {"resize": 256}, "cheaper transforms: do the fixed part (resizing to the training size, colour "
            "conversion) once ahead of training and keep only the random part per sample"),
        Fix(CHANGE, "augment on the GPU, on whole batches, instead of {top} on the CPU: "
                    "torchvision.transforms.v2 on CUDA tensors (v2.RandomResizedCrop, v2.ColorJitter on "
                    "batch.cuda()), kornia.augmentation (RandomAffine, ColorJitter, RandomGaussianBlur on CUDA "
                    "batches), or NVIDIA DALI (fn.decoders.image(device=\"mixed\"), fn.random_resized_crop, "
                    "fn.rotate on the GPU)"),
    ),
    "ipc": _IPC,
    "collate": _IPC,
    "dataset": (
        Fix(NOTE, "the time goes to the dataset's own Python code: profile __getitem__ "
                  "(py-spy record --subprocesses) or move its work into the conversion"),
    ),
}


class Fixes:
    """Fixes in the order to try them: shell commands (also in ``commands``) and code changes
    (also in ``notes``); plain remarks go to ``notes`` only."""

    def __init__(self, root: Optional[str], formats: Optional[Sequence[str]]) -> None:
        self.root, self.formats = root, tuple(formats or ())
        self.unchecked = formats is None  # the scan to check them did not finish
        self.fixes: List[str] = []
        self.commands: List[str] = []
        self.notes: List[str] = []
        self.refused: List[str] = []  # formats a fix would convert to that dsconvert shard refuses for root

    def command(self, text: str) -> None:
        self.fixes.append(text)
        self.commands.append(text)

    def change(self, text: str) -> None:
        if text not in self.fixes:
            self.fixes.append(text)
            self.notes.append(text)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def shard(self, fmt: str, options: Mapping[str, object], comment: str, otherwise: Optional[str]) -> bool:
        """Suggest ``dsconvert shard ROOT --format FMT`` (beside ROOT, as ``dsconvert analyze``
        suggests) when ROOT is known and dsconvert takes it for FMT; else the code change
        ``otherwise``. True when the command was suggested."""
        if self.root and fmt in self.formats:
            self.command(shard_command(self.root, fmt, options=options, comment=comment))
            return True
        if self.root and fmt not in self.refused:
            self.refused.append(fmt)
        if otherwise:
            self.change(otherwise)
        return False


def apply_fixes(category: str, fx: Fixes, details: Dict[str, float], fast_decoder: Optional[str]) -> None:
    """Add the fixes of ``category`` (the FIXES rows whose condition holds) to ``fx``; ``details``:
    the category's details and their shares."""
    ctx = FixContext(top=max(details, key=details.__getitem__) if details else category, fast_decoder=fast_decoder,
                     pillow=any("Pillow" in d for d in details),
                     wds_out=output_for(fx.root, "wds") if fx.root else "",
                     npy_out=output_for(fx.root, "npy") if fx.root else "")
    for fix in FIXES.get(category, ()):
        if not fix.when(ctx):
            continue
        text = fix.text.format(**vars(ctx))
        if fix.kind == SHARD:
            otherwise = fix.otherwise.format(**vars(ctx)) if fix.otherwise else None
            fx.shard(fix.fmt, fix.options, text, otherwise)
        elif fix.kind == CHANGE:
            fx.change(text)
        else:
            fx.note(text)


def worker_fixes(bottleneck: str, fx: Fixes, num_workers: int, cpus: int, worker_busy: float) -> None:
    """The DataLoader's worker count, first: workers where there are none, more where they are
    all busy (or augmenting) and CPUs are free."""
    if bottleneck == "no-workers":
        fx.change(f"DataLoader(..., num_workers={cpus}, persistent_workers=True): load in {cpus} worker "
                  f"process(es) beside the training loop instead of inside it ({cpus} CPUs available)")
    elif num_workers < cpus and bottleneck != "ipc" and (bottleneck == "augment" or worker_busy > 0.8):
        fx.change(f"DataLoader(..., num_workers={cpus}): the {num_workers} DataLoader worker(s) are busy "
                  f"{worker_busy:.0%} of the time and {cpus} CPUs are available; more workers help until "
                  "the CPUs are saturated")
