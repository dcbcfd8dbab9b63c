"""``CachedDataset``: decode once, in the first epoch; read a memory map in every later one.

For users who cannot run an offline conversion: wrap the map-style dataset you already have
(without random augmentation; pass that as ``transform``)::

    ds = CachedDataset(ImageFolder("/nfs/train"), "/ssd/cache", transform=augment)

Cache folder layout, lock-free for any number of DataLoader workers writing at once:

``data-<pid>-<nonce>.bin``
    pixels appended by one process, HWC uint8, back to back.
``log-<pid>-<nonce>.bin``
    that process's records, appended after the pixels they describe, 44 bytes each:
    ``<qqiiiqII``: index, offset, height, width, channels (0 for a 2-D image), label, CRC-32
    of the pixels, magic. A record whose magic, length, extent or CRC does not check out is a
    write that a crash cut short: it is ignored and the sample computed again, never served.
``index.npy`` + ``files.json``
    written (atomically) once every sample is cached and every CRC has been checked: later
    processes load it instead of replaying the logs, and trust it without re-checking CRCs.
``cache.json``
    the cache's identity, taken when it is made and checked each time it is opened, so that a
    cache is not reused for another dataset: the number of samples; an identity, the one the
    caller passes (``identity=``) or the one the dataset names itself (a dsconvert output's
    manifest digest, a ``Mixture``'s, the digest of an ``ImageFolder``'s (path, label) list, a
    Hugging Face dataset's fingerprint); and digests of the pixels and labels of a few samples
    (the first, the last and two seeded ones), read again through the wrapped dataset at every
    open. A dataset that agrees on all of these but differs elsewhere (files edited in place
    under the same names) is not told apart: give it a new ``identity`` (a version) then.
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import os
import random
import reprlib
import struct
import time
import uuid
import warnings
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

from ..errors import ManifestError, OptionError
from ..io.localfs import atomic_write
from ..io.locks import file_lock
from ..processes import ProcessLocal, settle_worker
from .base import TorchDataset, Transforms, sample_index

__all__ = ["CachedDataset"]

RECORD = struct.Struct("<qqiiiqII")
MAGIC = 0xD5C0C4E1
INDEX_DTYPE = np.dtype([("file", "<i4"), ("offset", "<i8"), ("height", "<i4"), ("width", "<i4"),
                        ("channels", "<i4"), ("label", "<i8")])
REFRESH_SECONDS = 2.0  # a miss re-reads other processes' logs at most this often

Entry = Tuple[str, int, int, int, int, int, Optional[int]]  # file, offset, h, w, c, label, crc (None: checked)


def _as_pixels(image: Any) -> np.ndarray:
    """The image as uint8 HWC (or HW) pixels: RGB for PIL images of other modes."""
    if isinstance(image, Image.Image):
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        return np.asarray(image)
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim not in (2, 3):
        raise TypeError(f"CachedDataset caches uint8 HWC/HW images or PIL images, got {arr.dtype} {arr.shape}")
    return np.ascontiguousarray(arr)


SCHEMA = 2  # cache.json: 2 holds an identity and sampled digests (1 held the count only)


def sampled_positions(n: int) -> List[int]:
    """The samples whose digests identify a cache of ``n``: the first, the last, two seeded."""
    rng = random.Random(f"cache-identity:{n}")
    return sorted({0, n - 1, rng.randrange(n), rng.randrange(n)}) if n else []


def own_identity(dataset: Any) -> Optional[str]:
    """The identity a dataset names itself, where it does: a dsconvert output's manifest
    digest (or any ``identity`` string), an ``ImageFolder``'s (path, label) list, a Hugging
    Face dataset's fingerprint. None otherwise (the sampled digests still identify it)."""
    manifest = getattr(dataset, "manifest", None)
    ident = getattr(manifest, "identity", None) or getattr(dataset, "identity", None)
    ident = ident() if callable(ident) else ident
    if isinstance(ident, str):
        return ident
    fingerprint = getattr(dataset, "_fingerprint", None)
    if isinstance(fingerprint, str):
        return f"hf:{fingerprint}"
    samples = getattr(dataset, "samples", None)
    if isinstance(samples, list) and all(isinstance(x, tuple) and len(x) == 2 for x in samples[:1]):
        root = getattr(dataset, "root", None)  # the folder may be reached by another path later
        digest = hashlib.sha256()
        for path, label in samples:
            path = os.fspath(path)
            if isinstance(root, (str, os.PathLike)) and os.path.isabs(path):
                path = os.path.relpath(path, os.fspath(root))
            digest.update(f"{path}\0{label!r}\n".encode("utf-8", "surrogateescape"))
        return f"samples:{digest.hexdigest()[:32]}"
    return None


def _create_once(path: str, meta: Dict[str, Any]) -> Any:
    """Write ``meta`` to ``path`` unless it exists (a link of a complete temp file: never
    half a file, never replacing another process's); return what ``path`` then holds."""
    tmp = f"{path}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(meta, f)
        try:
            os.link(tmp, path)
        except FileExistsError:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        return meta
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(tmp)


class _State:
    """What one process knows of the cache, and its own append-only files."""

    def __init__(self, folder: str):
        self.folder = folder
        self.entries: Dict[int, Entry] = {}
        self.spares: Dict[int, List[Entry]] = {}  # other records of the same sample
        self.log_pos: Dict[str, int] = {}
        self.maps: Dict[str, np.ndarray] = {}
        self.last_refresh = 0.0
        self.data_fd: Optional[int] = None
        self.log_fd: Optional[int] = None
        self.data_name = ""
        self.data_end = 0
        self.broken = False  # writing failed once (disk full...): serve without caching


class CachedDataset(Transforms, TorchDataset):
    """Map-style dataset caching a wrapped map-style dataset's decoded ``(image, label)``."""

    def __init__(self, dataset: Any, cache_dir: str, transform: Optional[Callable] = None,
                 target_transform: Optional[Callable] = None, decode: str = "pil", identity: Optional[str] = None):
        """``identity``: what the wrapped dataset is (a name and version, say), recorded when the
        cache is made and compared at every open; by default the dataset's own where it names
        one. Sampled pixels are compared as well (the module doc)."""
        super().__init__(transform, target_transform, decode, getattr(dataset, "classes", None),
                         modes=("pil", "numpy"))
        self.dataset = dataset
        self.cache_dir = os.path.abspath(cache_dir)
        self.n = len(dataset)
        if identity is not None and not isinstance(identity, str):
            raise OptionError(f"identity is a string naming the dataset, not {type(identity).__name__}")
        self.identity = identity if identity is not None else own_identity(dataset)
        os.makedirs(self.cache_dir, exist_ok=True)
        self._check_identity(os.path.join(self.cache_dir, "cache.json"))
        self._local: Dict[str, _State] = ProcessLocal()  # file descriptors and maps belong to one process

    def _sampled(self) -> Dict[str, str]:
        """Digests of the pixels and labels of the sampled samples, read through the wrapped dataset."""
        out = {}
        for i in sampled_positions(self.n):
            image, label = self.dataset[i]
            pixels = _as_pixels(image)
            digest = hashlib.sha256(f"{pixels.shape}:{label!r}:".encode())
            digest.update(pixels.data)
            out[str(i)] = digest.hexdigest()[:32]
        return out

    def _check_identity(self, meta_path: str) -> None:
        """Make the cache's identity on first use, or check the wrapped dataset against it."""
        sampled = self._sampled()
        mine = {"schema_version": SCHEMA, "num_samples": self.n, "identity": self.identity, "sampled": sampled}
        try:
            with open(meta_path, encoding="utf-8") as f:
                meta = json.load(f)
        except FileNotFoundError:
            meta = _create_once(meta_path, mine)  # two processes making it at once: one wins, both check
        except ValueError as exc:
            raise ManifestError(f"{meta_path}: not valid JSON ({exc}); remove the cache folder", meta_path) from None
        where = f"{self.cache_dir} caches"
        if not isinstance(meta, dict) or meta.get("schema_version") != SCHEMA:
            raise ManifestError(f"{where} a dataset it cannot identify (made by an earlier dsconvert, or edited): "
                                "remove it (the next epoch fills it again) or use another cache_dir", self.cache_dir)
        if meta.get("num_samples") != self.n:
            raise ManifestError(f"{where} a dataset of {meta.get('num_samples')} samples, not {self.n}; use another "
                                "cache_dir or remove this one", self.cache_dir)
        theirs = meta.get("identity")
        if theirs is not None and self.identity is not None and theirs != self.identity:
            raise ManifestError(f"{where} the dataset {reprlib.repr(theirs)}, not {reprlib.repr(self.identity)}: use "
                                "another cache_dir or remove this one", self.cache_dir)
        differs = sorted(int(i) for i, d in sampled.items() if (meta.get("sampled") or {}).get(i) != d)
        if differs:
            raise ManifestError(
                f"{where} another dataset: sample {differs[0]}'s pixels or label differ from the ones it was made "
                "with; use another cache_dir or remove this one (a wrapped dataset that augments at random "
                "cannot be cached: pass the augmentation as transform=)", self.cache_dir)

    def __len__(self) -> int:
        return self.n

    # --- state --------------------------------------------------------------------------

    def _st(self) -> _State:
        st = self._local.get("state")
        if st is None:
            settle_worker()
            st = self._local["state"] = _State(self.cache_dir)
            self._load_index(st)
            self._refresh(st)
            if len(st.entries) == self.n:
                self._consolidate(st)
        return st

    def _load_index(self, st: _State) -> None:
        try:
            with open(os.path.join(self.cache_dir, "files.json")) as f:
                files = json.load(f)
            rows = np.load(os.path.join(self.cache_dir, "index.npy"))
        except (OSError, ValueError):
            return
        if len(rows) != self.n:
            return
        for i, (fi, o, h, w, c, label) in enumerate(rows.tolist()):
            st.entries[i] = (files[fi], o, h, w, c, label, None)

    def _refresh(self, st: _State) -> None:
        """Read the records other processes appended since the last look."""
        st.last_refresh = time.monotonic()
        for log in sorted(glob.glob(os.path.join(self.cache_dir, "log-*.bin"))):
            name = os.path.basename(log)
            start = st.log_pos.get(name, 0)
            try:
                with open(log, "rb") as f:
                    f.seek(start)
                    blob = f.read()
            except OSError:
                continue
            usable = len(blob) - len(blob) % RECORD.size  # a torn last record waits (or is lost)
            data_name = "data-" + name[len("log-"):]
            try:
                data_size = os.path.getsize(os.path.join(self.cache_dir, data_name))
            except OSError:
                data_size = -1
            for pos in range(0, usable, RECORD.size):
                i, o, h, w, c, label, crc, magic = RECORD.unpack_from(blob, pos)
                if magic != MAGIC or not 0 <= i < self.n:
                    continue
                if o < 0 or o + h * w * max(c, 1) > data_size:
                    continue
                entry = (data_name, o, h, w, c, label, crc)
                if i in st.entries:  # cached twice (or again after damage): keep as a spare
                    st.spares.setdefault(i, []).append(entry)
                else:
                    st.entries[i] = entry
            st.log_pos[name] = start + usable

    def _map(self, st: _State, name: str, end: int) -> np.ndarray:
        m = st.maps.get(name)
        if m is None or len(m) < end:
            path = os.path.join(self.cache_dir, name)
            m = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)
            st.maps[name] = m
        return m

    def _pixels(self, st: _State, i: int) -> Optional[np.ndarray]:
        """The cached pixels of sample i, or None when absent or every record of it fails
        its CRC (cut short or damaged: the caller computes it again)."""
        while True:
            entry = st.entries.get(i)
            if entry is None:
                return None
            name, o, h, w, c, label, crc = entry
            nbytes = h * w * max(c, 1)
            flat = self._map(st, name, o + nbytes)[o: o + nbytes]
            if crc is None or zlib.crc32(flat.data) == crc:
                break
            spares = st.spares.get(i)
            if spares:
                st.entries[i] = spares.pop(0)
            else:
                del st.entries[i]
        if crc is not None:
            st.entries[i] = entry[:6] + (None,)
        return flat.reshape((h, w, c) if c else (h, w))

    def _append(self, st: _State, i: int, pixels: np.ndarray, label: int) -> None:
        if st.broken:
            return
        try:
            if st.data_fd is None:
                tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
                st.data_name = f"data-{tag}.bin"
                flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
                st.data_fd = os.open(os.path.join(self.cache_dir, st.data_name), flags, 0o644)
                st.log_fd = os.open(os.path.join(self.cache_dir, f"log-{tag}.bin"), flags, 0o644)
                st.data_end = 0
            _write_all(st.data_fd, pixels.data.cast("B"))
            h, w = pixels.shape[:2]
            c = pixels.shape[2] if pixels.ndim == 3 else 0
            record = RECORD.pack(i, st.data_end, h, w, c, label, zlib.crc32(pixels.data), MAGIC)
            assert st.log_fd is not None  # opened with data_fd (a failed open breaks the cache)
            _write_all(st.log_fd, record)  # only now is the sample visible to anyone
            st.entries[i] = (st.data_name, st.data_end, h, w, c, label, None)
            st.data_end += pixels.nbytes
        except OSError as exc:
            st.broken = True
            warnings.warn(f"CachedDataset stops caching in this process: {exc}", RuntimeWarning,
                          stacklevel=3)  # the code that indexed the dataset

    def _consolidate(self, st: _State) -> None:
        """Check every CRC once and write index.npy, unless it exists or another process is
        doing it (then the CRCs are checked sample by sample as they are read)."""
        if os.path.exists(os.path.join(self.cache_dir, "index.npy")):
            return
        with file_lock(os.path.join(self.cache_dir, ".consolidate.lock"), wait=False) as got:
            if not got:
                return
            for i in range(self.n):
                if self._pixels(st, i) is None:
                    return  # one was damaged: not complete after all
            files = sorted({e[0] for e in st.entries.values()})
            fid = {name: k for k, name in enumerate(files)}
            rows = np.array([(fid[e[0]],) + e[1:6] for e in (st.entries[i] for i in range(self.n))],
                            dtype=INDEX_DTYPE)
            with atomic_write(os.path.join(self.cache_dir, "files.json"), "w") as f:
                json.dump(files, f)
            with atomic_write(os.path.join(self.cache_dir, "index.npy")) as f:
                np.save(f, rows)

    # --- the dataset --------------------------------------------------------------------

    @property
    def is_complete(self) -> bool:
        """True when every sample is cached (later reads never touch the wrapped dataset)."""
        st = self._st()
        if len(st.entries) < self.n:
            self._refresh(st)
        return len(st.entries) == self.n

    def __getitem__(self, index: int) -> Tuple[Any, Any]:
        i = sample_index(index, self.n)
        st = self._st()
        pixels = self._pixels(st, i)
        if pixels is None and time.monotonic() - st.last_refresh > REFRESH_SECONDS:
            self._refresh(st)  # another worker may have cached it meanwhile
            pixels = self._pixels(st, i)
        if pixels is None:
            image, label = self.dataset[i]
            try:
                label = int(label)
            except (TypeError, ValueError):
                raise TypeError(f"CachedDataset caches integer labels, got {label!r}") from None
            pixels = _as_pixels(image)
            self._append(st, i, pixels, label)
        else:
            label = st.entries[i][5]
        return self._finish(pixels if self.decode == "numpy" else Image.fromarray(pixels), label)


def _write_all(fd: int, data: Any) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
