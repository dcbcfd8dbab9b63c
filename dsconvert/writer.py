"""Writing from Python: :class:`Writer` (push samples one by one) and :func:`optimize` (map a
function over inputs on an executor). Both make an ordinary dsconvert output: shards of the
chosen format, each with its record, and the manifest last, so ``open_dataset``, ``verify``
and webdataset read it as they read a conversion's.

A sample is a dict ``{"__key__": "a/b", "jpg": ..., "cls": 3, "json": {...}, ...}``, as
webdataset's ``ShardWriter`` takes it. Each value is stored as bytes by its field's extension
(:func:`encode_fields`): ``bytes`` as they are; a PIL image or an HWC uint8 array encoded as the
image extension says (JPEG at ``quality``, PNG, WebP...); an array under ``npy`` by ``np.save``;
``str`` as UTF-8; an ``int`` under a class extension (``cls``) as decimal text; dicts, lists,
numbers and booleans under ``json`` as JSON (sorted keys). Anything else (text with a lone
surrogate, JSON nested past the recursion limit included) is one :class:`BadInputError` naming
the sample and the field. Field names are stored lowercased, as webdataset reads them; two that
would then coincide are refused. Options are checked when the Writer is made (or before
:func:`optimize` calls ``fn``), never found bad at ``close()``.

Samples that are exactly one image and an ``int`` ``cls`` make an (image, label) output
(``sample_type="classification"``: read back as ImageFolder's ``(image, class_index)``, and the
only kind hdf5 and npy hold); others a dict output. ``sample_type="auto"`` decides by the first
sample (of each shard, for :func:`optimize`); a later sample of the other kind is an error that
says to pass ``sample_type="dict"``.

:func:`optimize` cuts the inputs into contiguous runs by index (``samples_per_shard``, spread
over up to ``min_shards`` as :func:`dsconvert.plan.spread_plan` does), one shard per run, so the
bytes do not depend on the number of workers. Each shard's spec carries a digest of its inputs
(their pickles, sets in a fixed order: the same in every process, :func:`_fingerprint`);
a killed run, started again, keeps every finished shard whose spec is unchanged and calls ``fn``
only for the inputs of the others. Both are built on :mod:`dsconvert.write`, as conversion is:
the option checks, the output's life cycle (the claim on the folder, its lock, the owner
journal, the manifest) and, for :func:`optimize`, the executor loop.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import io
import json
import pickle
import queue
import re
import sys
import threading
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Type,
    Union,
)

import numpy as np

from .codecs import PICKLE_EXTENSIONS, compression_label, field_kind, resolve_decoder
from .convert import ConvertResult, build_manifest
from .errors import BadInputError, OptionError
from .formats import FORMATS, Format, get
from .io.location import Location, local_form
from .keys import encode_key
from .manifest import Manifest
from .plan import MIN_SHARDS, ShardResult, ShardSpec, spread_plan
from .processes import available_cpus
from .progress import progress_bar
from .samples import LABEL_MAX, Sample, Source, SourceFile
from .write import loop
from .write.options import (
    check_compression,
    check_decode,
    check_flag,
    check_format,
    check_positive,
    check_prefix,
    check_quality,
    check_shard_size,
    check_storage_options,
)
from .write.output import ForeignFiles, Output, open_output

__all__ = ["Writer", "optimize", "encode_fields", "SAMPLE_TYPES", "KEY_DIGITS", "QUALITY"]

SAMPLE_TYPES = ("auto", "classification", "dict")
QUALITY = 95  # JPEG and WebP quality for images given as pixels (webdataset's ShardWriter default too)
KEY_DIGITS = 8  # a sample without __key__ is keyed by its index, zero-padded to this many digits
_FIELD = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_RESERVED = re.compile(r"__.*__")  # webdataset's own (__key__, __url__, __local_path__)
_PIL_FORMATS = {"jpg": "JPEG", "jpeg": "JPEG", "png": "PNG", "ppm": "PPM", "pgm": "PPM", "bmp": "BMP",
                "tif": "TIFF", "tiff": "TIFF", "webp": "WEBP"}


# --- samples -> bytes --------------------------------------------------------------------


def _ext(name: str) -> str:
    return name.rsplit(".", 1)[-1].lower()


def _image_bytes(value: Any, name: str, quality: int, where: str) -> bytes:
    from PIL import Image

    if isinstance(value, np.ndarray):
        if value.dtype != np.uint8 or value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (1, 3, 4)):
            raise BadInputError(f"field {name!r}: an image array must be uint8 HxW or HxWxC (C 1, 3 or 4), "
                                f"not {value.dtype} {value.shape}", where)
        value = Image.fromarray(value[:, :, 0] if value.ndim == 3 and value.shape[2] == 1 else value)
    fmt = _PIL_FORMATS[_ext(name)]
    image = value
    if fmt == "JPEG" and image.mode not in ("L", "RGB", "CMYK"):
        image = image.convert("RGB")  # JPEG holds no alpha or palette
    elif fmt == "PPM" and image.mode not in ("1", "L", "RGB"):
        image = image.convert("L" if _ext(name) == "pgm" else "RGB")
    buf = io.BytesIO()
    try:
        if fmt == "JPEG":
            image.save(buf, "JPEG", quality=quality)
        elif fmt == "WEBP":
            image.save(buf, "WEBP", quality=quality)
        else:
            image.save(buf, fmt)
    except (OSError, ValueError, KeyError) as exc:
        raise BadInputError(f"field {name!r}: Pillow cannot encode a {image.mode} image as {fmt} ({exc})",
                            where) from None
    return buf.getvalue()


def _value_bytes(value: Any, name: str, quality: int, where: str) -> bytes:
    """One field's value as the bytes stored for it; see the module doc."""
    kind = field_kind(name)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if kind == "image" and (isinstance(value, np.ndarray) or _is_pil(value)):
        return _image_bytes(value, name, quality, where)
    if kind == "npy" and isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise BadInputError(f"field {name!r}: an object array would need pickle; store numbers or strings", where)
        buf = io.BytesIO()
        np.save(buf, value, allow_pickle=False)
        return buf.getvalue()
    if kind in ("image", "npy"):
        takes = "a PIL image or a uint8 array" if kind == "image" else "a numpy array"
        raise BadInputError(f"field {name!r} takes bytes or {takes}, not {type(value).__name__}", where)
    if isinstance(value, str):
        return _utf8(value, name, where)
    if kind == "class" and type(value) is int:
        return str(value).encode("ascii")
    if kind == "text" and type(value) is int:
        return str(value).encode("ascii")
    if kind == "json" and (value is None or isinstance(value, (dict, list, tuple, int, float, bool))):
        try:
            text = json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False)
        except RecursionError:
            raise BadInputError(f"field {name!r}: nested too deeply to store as JSON (past Python's recursion "
                                f"limit, {sys.getrecursionlimit()} levels, which reading it back would hit too)",
                                where) from None
        except (TypeError, ValueError) as exc:
            raise BadInputError(f"field {name!r}: not JSON-able ({_one_line(exc)})", where) from None
        return _utf8(text, name, where)
    raise BadInputError(f"field {name!r}: cannot store a {type(value).__name__} under a {kind} extension "
                        "(bytes, str, a PIL image or array under an image extension, an array under npy, an int "
                        "under cls, JSON-able values under json)", where)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _utf8(text: str, name: str, where: str) -> bytes:
    """``text`` as UTF-8; a lone surrogate (``"\\ud800"``: half of a pair, which UTF-8 cannot
    hold) is one BadInputError naming the field."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadInputError(f"field {name!r}: its text holds a lone surrogate ({text[exc.start]!r}), which UTF-8 "
                            "cannot store: mend the string, or give bytes", where) from None


def _is_pil(value: Any) -> bool:
    return type(value).__module__.startswith("PIL.") and hasattr(value, "save") and hasattr(value, "mode")


def _check_key(key: Any, where: str) -> str:
    if not isinstance(key, str):
        raise BadInputError(f"__key__ must be a str, not {type(key).__name__}", where)
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise BadInputError(f"__key__ {key!r} holds a lone surrogate, which UTF-8 (and a tar member name) cannot "
                            "store", where) from None
    try:
        safe = encode_key(key)
    except ValueError:
        safe = None
    if safe != key or {"", ".", ".."} & set(key.split("/")):
        raise BadInputError(f"__key__ {key!r} is not tar- and webdataset-safe: use a relative path without dots in "
                            "its last part, empty, '.' or '..' parts, %, ~, backslashes or control characters", where)
    return key


def _classification_shaped(sample: Mapping[str, Any]) -> bool:
    """Exactly one image field and an int ``cls``: an (image, label) sample."""
    names = [n for n in sample if n != "__key__"]
    cls = sample.get("cls")
    return (len(names) == 2 and "cls" in names and type(cls) is int
            and field_kind(next(n for n in names if n != "cls")) == "image")


def encode_fields(sample: Any, default_key: str, quality: int = QUALITY, num_classes: Optional[int] = None
                  ) -> Tuple[str, Dict[str, bytes], Optional[int]]:
    """A sample dict as (key, fields as bytes, label): the label is the ``int`` ``cls`` of an
    (image, label)-shaped sample, else None. A BadInputError, in one line, for anything that
    cannot be stored (see the module doc), or a label past ``num_classes`` (the classes named).

    Field names are stored lowercased, as webdataset reads them (it lowercases every field
    name, and raises on two that then coincide): ``TXT`` is stored and read back as ``txt``,
    by dsconvert and webdataset alike, and two names that webdataset would read as one
    (``txt`` and ``TXT``) are refused, naming both. (Under ``compress``, ``txt`` and
    ``TXT.zst``, lowercased here, are the wds sink's field and its ``.zst`` twin: a counted
    skip, as in conversion.)"""
    if not isinstance(sample, Mapping):
        raise BadInputError(f"a sample is a dict of fields, not a {type(sample).__name__}", default_key)
    key = _check_key(sample["__key__"], default_key) if "__key__" in sample else default_key
    fields: Dict[str, bytes] = {}
    values: Dict[str, Any] = {}  # by the name as stored (lowercased)
    given: Dict[str, str] = {}  # the name stored (and read by webdataset) -> the name given
    for name, value in sample.items():
        if name == "__key__":
            continue
        if not isinstance(name, str) or not _FIELD.fullmatch(name) or _RESERVED.fullmatch(name.lower()):
            raise BadInputError(f"field name {name!r} is not a file extension (letters, digits, _ and -, parts "
                                "joined by dots: jpg, seg.png, json)", key)
        stored = name.lower()
        if stored in given:
            raise BadInputError(f"fields {given[stored]!r} and {name!r} would both be read as {stored!r} "
                                "(webdataset lowercases field names): rename one", key)
        given[stored] = name
        if _ext(name) in PICKLE_EXTENSIONS:
            raise BadInputError(f"field {name!r}: pickled fields are not written (they run code when read); "
                                "store JSON, npy or bytes", key)
        if value is None:
            raise BadInputError(f"field {name!r} is None: leave the field out", key)
        fields[stored] = _value_bytes(value, name, quality, key)
        values[stored] = value
    if not fields:
        raise BadInputError("the sample has no fields besides __key__", key)
    label = None
    if _classification_shaped(values):
        label = values["cls"]
        if not 0 <= label <= LABEL_MAX:
            raise BadInputError(f"cls {label} is outside 0..{LABEL_MAX}", key)
        if num_classes is not None and label >= num_classes:
            raise BadInputError(f"cls {label} is past the {num_classes} classes named (0..{num_classes - 1})", key)
    return key, fields, label


def _as_written(key: str, fields: Dict[str, bytes], label: Optional[int], sample_type: str, path: str
                ) -> Tuple[Sample, Dict[str, bytes]]:
    """The (Sample, fields) pair ``Format.write_shard`` takes: a classification sample's label
    rides on the Sample (its format writes it), a dict sample's ``cls`` stays a field."""
    if sample_type == "classification":
        fields = {n: v for n, v in fields.items() if n != "cls"}
    size = sum(len(v) for v in fields.values())
    label = label if sample_type == "classification" else None
    return Sample(key, (SourceFile("input", path, size, 0),), label), fields


def _kind_error(key: str, fields: Iterable[str], requested: str) -> BadInputError:
    """A sample that is not (image, cls) in an (image, label) output."""
    how = ("the samples before it were (image, cls) samples: give every sample one image field and an int cls, "
           "or pass sample_type='dict'") if requested == "auto" else \
        "sample_type='classification' needs one image field and an int cls in every sample"
    return BadInputError(f"the sample has fields {sorted(fields)}, and {how}", key)


# --- options shared by Writer and optimize ------------------------------------------------


def _check_dict_samples(fmt: Type[Format], sample_type: str) -> None:
    """hdf5 and npy hold (image, label) samples only: dict samples are one clear error."""
    if sample_type == "dict" and not fmt.any_samples:
        raise OptionError(f"the {fmt.id} format holds (image, label) samples (one image field and an int cls each): "
                          f"use format={', '.join(repr(f) for f in FORMATS if get(f).any_samples)} for dict samples")


def _format_options(fmt: Type[Format], decode: bool, classes: Optional[List[str]], quality: int,
                    sample_type: str, compression: Optional[Dict[str, Any]] = None) -> Tuple[bool, Dict[str, Any]]:
    """Whether pixels are stored, and the options every shard's spec carries (compression
    already checked: :func:`dsconvert.write.options.check_compression`)."""
    decode = check_decode(fmt, decode)
    _check_dict_samples(fmt, sample_type)
    decoder = resolve_decoder("auto") if decode else None
    source = Source("", "auto", [], classes=list(classes) if classes is not None else None)
    return decode, {"decode": decode, "resize": None, "size": None, "decoder": decoder, "quality": quality,
                    **fmt.writer_options(source), **({"compress": compression} if compression else {})}


def _check_common(format: Any, sample_type: Any, quality: Any, prefix: Any, samples_per_shard: Any,
                  classes: Any = None, decode: Any = False, overwrite: Any = False,
                  storage_options: Any = None) -> Type[Format]:
    """Every option Writer and optimize share, checked before anything is written: a bad one
    found at ``close()`` would lose a whole run's samples."""
    fmt = check_format(format)
    if not isinstance(sample_type, str) or sample_type not in SAMPLE_TYPES:
        raise OptionError(f"sample_type must be one of {SAMPLE_TYPES}, not {sample_type!r}")
    check_quality(quality)
    check_prefix(prefix)
    check_positive("samples_per_shard", samples_per_shard)
    _check_classes(classes)
    check_flag("decode", decode)
    check_flag("overwrite", overwrite)
    check_storage_options(storage_options)
    return fmt


def _check_classes(classes: Any) -> None:
    """None, or the class names of an (image, label) output, in label order: a list (or tuple)
    of distinct strings, as ImageFolder's ``classes`` are (a set has no order; a str would be
    taken letter by letter)."""
    if classes is None:
        return
    if not isinstance(classes, (list, tuple)):
        raise OptionError(f"classes must be a list of class names (str) in label order, not a "
                          f"{type(classes).__name__}")
    if not classes:
        raise OptionError("classes must name at least one class (or be None)")
    for i, name in enumerate(classes):
        if not isinstance(name, str):
            raise OptionError(f"classes must be a list of class names (str): classes[{i}] is {name!r}")
    if len(set(classes)) < len(classes):
        twice = next(c for i, c in enumerate(classes) if c in classes[:i])
        raise OptionError(f"classes names {twice!r} twice: class names are distinct")
    if len(classes) > LABEL_MAX + 1:
        raise OptionError(f"classes names {len(classes):,} classes, more than labels 0..{LABEL_MAX} hold")


def _finish(output: Output, fmt: Type[Format], prefix: str, url: str, sample_type: str,
            classes: Optional[List[str]], inputs: List[Sample], results: List[ShardResult],
            options: Dict[str, Any], decoded: bool, compression: Optional[Dict[str, Any]] = None) -> Manifest:
    """Remove what an earlier run left that this one did not write; then the manifest."""
    _check_unique_keys(output.location, fmt, results)
    output.remove_stale(fmt, prefix, results)
    source = Source("", "auto", inputs, classes=classes, labelled=sample_type == "classification")
    manifest = build_manifest(url, source, fmt.id, results, options, decoded, compression)
    output.save(manifest)
    return manifest


def _check_unique_keys(location: Location, fmt: Type[Format], results: List[ShardResult]) -> None:
    """Keys are unique across shards (each shard checked its own as it wrote)."""
    seen: Dict[str, str] = {}
    for r in results:
        if r.entry.index is None:  # every format records its shards; a record-less entry has no keys to check
            continue
        record = fmt.load_record(location.url_of(r.entry.index), location.read_bytes(r.entry.index))
        for key in record.keys:
            if key in seen:
                raise BadInputError(f"__key__ {key!r} is given twice (in {seen[key]} and {r.entry.name}): keys must be "
                                    "unique", key)
            seen[key] = r.entry.name


# --- Writer --------------------------------------------------------------------------------


_END = object()
_ABORT = object()


class _ShardThread:
    """One shard being written by ``Format.write_shard`` in a thread, fed through a queue: the
    format's loop pulls samples, and :meth:`Writer.write` pushes them."""

    def __init__(self, fmt: Type[Format], spec: ShardSpec):
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=16)
        self.result: Optional[ShardResult] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(fmt, spec), daemon=True,
                                       name=f"dsconvert-writer-{spec.index}")
        self.thread.start()

    def _samples(self) -> Iterator[Tuple[Sample, Dict[str, bytes]]]:
        while True:
            item = self.queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise _Aborted()
            yield item

    def _run(self, fmt: Type[Format], spec: ShardSpec) -> None:
        try:
            self.result = fmt.write_shard(spec, self._samples())
        except BaseException as exc:  # handed to the writing thread
            self.error = exc

    def put(self, item: Any) -> None:
        while True:
            if self.error is not None or not self.thread.is_alive():
                self._raise()
            try:
                self.queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _raise(self) -> None:
        if self.error is not None and not isinstance(self.error, _Aborted):
            raise self.error
        raise RuntimeError("internal error: the shard writer stopped")

    def finish(self) -> ShardResult:
        self.put(_END)
        self.thread.join()
        if self.error is not None or self.result is None:
            self._raise()
        return self.result  # type: ignore[return-value]

    def abort(self) -> None:
        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.put(_ABORT)
            self.thread.join()


class _Aborted(Exception):
    pass


class Writer:
    """Write samples into a new dsconvert output at ``out`` (a folder or fsspec URL)::

        with dsconvert.Writer("/data/out", format="wds") as w:
            w.write({"__key__": "cat/0", "jpg": pil_image, "cls": 3})

    Shards hold at most ``samples_per_shard`` samples and ``shard_size`` bytes; they are
    written as samples arrive (one shard in memory at most: a queue of 16 samples), and the
    manifest on a clean exit of the ``with`` block (or :meth:`close`). An exception inside the
    block leaves no manifest: the output is unfinished, and the next Writer on it replaces what
    it holds. Values are encoded as :func:`encode_fields` says; ``sample_type`` and the rules
    for keys are in the module doc. ``classes``: class names for (image, label) outputs.
    ``decode``: hdf5 stores decoded pixels (npy always does). ``compress``: ``"zstd"`` or
    ``"zstd:LEVEL"`` stores a wds output's non-image fields zstd-compressed (as
    :func:`dsconvert.convert` does). Returns nothing; ``manifest``
    holds the result after the block.
    """

    def __init__(self, out: str, format: str = "wds", *, samples_per_shard: int = 10000,
                 shard_size: Union[int, str] = "1GB", sample_type: str = "auto", classes: Optional[List[str]] = None,
                 quality: int = QUALITY, decode: bool = False, prefix: str = "shard", overwrite: bool = False,
                 storage_options: Optional[Dict[str, Any]] = None, compress: Optional[str] = None):
        self.fmt = _check_common(format, sample_type, quality, prefix, samples_per_shard, classes, decode, overwrite,
                                 storage_options)
        self.shard_bytes = check_shard_size(shard_size)
        self.compression = check_compression(self.fmt, compress)
        self.decoded, self.format_options = _format_options(self.fmt, decode, classes, quality, sample_type,
                                                            self.compression)
        self.out = local_form(out)
        self.samples_per_shard = samples_per_shard
        self.requested = sample_type
        self.sample_type: Optional[str] = None if sample_type == "auto" else sample_type
        self.classes = list(classes) if classes is not None else None
        self.quality = quality
        self.prefix = prefix
        self.overwrite = overwrite
        self.storage_options = dict(storage_options or {})
        self.manifest: Optional[Manifest] = None
        self._stack: Optional[contextlib.ExitStack] = None
        self._keys: set = set()
        self._inputs: List[Sample] = []
        self._results: List[ShardResult] = []
        self._shard: Optional[_ShardThread] = None
        self._shard_samples: List[Sample] = []
        self._shard_count = 0
        self._shard_nbytes = 0
        self._options = {"writer": "Writer", "format": format, "samples_per_shard": samples_per_shard,
                         "shard_size": self.shard_bytes, "prefix": prefix, "sample_type": sample_type,
                         "quality": quality, "decode": self.decoded,
                         **({"compress": compression_label(self.compression)} if self.compression else {})}

    def __enter__(self) -> Writer:
        self.open()
        return self

    def __exit__(self, kind: Any, value: Any, tb: Any) -> None:
        if kind is None:
            self.close()
        else:
            self._abort()

    def open(self) -> None:
        """Claim and lock the output (what ``with`` does on entry)."""
        if self._stack is not None:
            return
        stack = contextlib.ExitStack()
        try:
            self.location = Location(self.out, self.storage_options)
            self.output = stack.enter_context(open_output(self.location, self.overwrite, resumable=False))
            self.owned = self.output.owned
            self.output.finished("output")  # a finished output is replaced, never extended
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def write(self, sample: Mapping[str, Any]) -> str:
        """Write one sample (a dict of fields, see the module doc); returns its key."""
        if self.manifest is not None:
            raise OptionError(f"this Writer is closed: {self.location.url} is finished; open a new Writer to "
                              "write more")
        if self._stack is None:
            self.open()
        index = len(self._inputs)
        key, fields, label = encode_fields(sample, f"{index:0{KEY_DIGITS}d}", self.quality,
                                           len(self.classes) if self.classes is not None else None)
        if key in self._keys:
            raise BadInputError(f"__key__ {key!r} is given twice: keys must be unique", key)
        shaped = label is not None
        if self.sample_type is None:
            self.sample_type = "classification" if shaped else "dict"
            if self.sample_type == "dict":
                _check_dict_samples(self.fmt, "dict")  # hdf5/npy: one clear error
        if self.sample_type == "classification" and not shaped:
            raise _kind_error(key, fields, self.requested)
        self._keys.add(key)
        written, data = _as_written(key, fields, label, self.sample_type, key)
        # bytes in the shard, each field a member (a tar's headers and padding counted)
        size = self.fmt.sample_bytes(Sample(key, tuple(SourceFile(n, "", len(v), 0) for n, v in data.items())),
                                     self.sample_type == "classification", bool(self.compression))
        if self._shard is not None and (self._shard_count + 1 > self.samples_per_shard
                                        or self._shard_nbytes + size > max(1, self.shard_bytes - self.fmt.overhead)):
            self._results.append(self._shard.finish())
            self._shard = None
        if self._shard is None:
            self._start_shard()
        self._inputs.append(written)
        self._shard_samples.append(written)
        self._shard_count += 1
        self._shard_nbytes += size
        assert self._shard is not None
        self._shard.put((written, data))
        return key

    def _start_shard(self) -> None:
        index = len(self._results)
        self._shard_samples = []  # the spec holds this list: its digest, taken when the shard ends, covers them
        spec = ShardSpec(self.fmt.id, index, self.fmt.shard_name(self.prefix, index), "", self.location.url,
                         self.sample_type or "dict", self._shard_samples,
                         False, None, False, self.format_options, self.storage_options, "files", (), self.owned.token)
        if not self.overwrite:  # a file where this shard goes must be one an earlier run of this output left
            ForeignFiles(self.owned).refuse(self.fmt, spec)
        self._shard = _ShardThread(self.fmt, spec)
        self._shard_count = 0
        self._shard_nbytes = 0

    def close(self) -> Manifest:
        """Finish the last shard and write the manifest (what ``with`` does on a clean exit)."""
        if self.manifest is not None:
            return self.manifest
        if self._stack is None:
            self.open()
        try:
            if self._shard is not None:
                self._results.append(self._shard.finish())
                self._shard = None
            sample_type = self.sample_type or ("classification" if not self.fmt.any_samples else "dict")
            self.manifest = _finish(self.output, self.fmt, self.prefix, "python:dsconvert.Writer",
                                    sample_type, self.classes, self._inputs, self._results, self._options,
                                    self.decoded, self.compression)
        except BaseException:
            self._abort()
            raise
        assert self._stack is not None
        self._stack.close()
        self._stack = None
        return self.manifest

    def _abort(self) -> None:
        if self._shard is not None:
            self._shard.abort()
            self._shard = None
        if self._stack is not None:
            self._stack.close()
            self._stack = None


# --- optimize ------------------------------------------------------------------------------


class _StablePickler(pickle.Pickler):
    """pickle, but every set and frozenset (of any subclass, at any depth) written as its
    elements' own fingerprints in sorted order: a set's iteration order, and so its plain
    pickle, changes with the process's string hash seed (``PYTHONHASHSEED``). Everything else
    is written exactly as ``pickle.dumps`` writes it, so inputs without sets keep the
    fingerprints earlier versions recorded."""

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, (set, frozenset)):
            state = getattr(obj, "__dict__", None)  # a subclass's own attributes
            return ("dsconvert-unordered", f"{type(obj).__module__}.{type(obj).__qualname__}",
                    tuple(sorted(_fingerprint(x) for x in obj)), _fingerprint(state) if state else b"")
        return None


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _fingerprint(value: Any, index: Optional[int] = None) -> bytes:
    """What an input is, for the resume check, the same in every process: its pickle (what a
    worker receives) with sets in a fixed order (:class:`_StablePickler`), or, for an input
    that does not pickle (one worker, in-process), its repr; a repr that names a memory address
    (``<object at 0x7f...>``) differs in every process, and is refused."""
    buf = io.BytesIO()
    try:
        _StablePickler(buf, protocol=4).dump(value)
        return buf.getvalue()
    except RecursionError:
        raise
    except Exception as exc:
        text = repr(value)
        if _ADDRESS.search(text):
            where = f"input {index}" if index is not None else "an input"
            raise OptionError(f"{where} (a {type(value).__name__}) does not pickle ({_one_line(exc)}) and its repr "
                              "names a memory address, so a rerun could not tell it is the same input: give inputs "
                              "that pickle (numbers, strings, paths, tuples, dicts...)") from None
        return text.encode("utf-8", "surrogateescape")


def _fn_name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


def _input_path(i: int) -> str:
    return f"inputs/{i}"


def _optimize_shard(spec: ShardSpec, fn: Callable[[Any], Any], chunk: Sequence[Any], first: int,
                    requested: str, num_classes: Optional[int] = None) -> Tuple[str, ShardResult]:
    """Run ``fn`` over one shard's inputs and write the shard (in a worker): returns the
    sample type it was written as, and its result."""
    fmt = get(spec.format)
    quality = spec.options["quality"]
    keys: set = set()

    def encoded(j: int) -> Union[Tuple[str, Dict[str, bytes], Optional[int]], BadInputError]:
        i = first + j
        out = fn(chunk[j])
        if out is None:
            return BadInputError("fn returned None for this input: nothing written")
        key, fields, label = encode_fields(out, f"{i:0{KEY_DIGITS}d}", quality, num_classes)
        if key in keys:
            raise BadInputError(f"__key__ {key!r} is given twice: keys must be unique", key)
        keys.add(key)
        return key, fields, label

    done: Dict[int, Any] = {}
    sample_type = requested
    if requested == "auto":  # decided by the shard's first sample
        sample_type = "classification" if not fmt.any_samples else "dict"
        for j in range(len(chunk)):
            done[j] = encoded(j)
            if not isinstance(done[j], BadInputError):
                sample_type = "classification" if done[j][2] is not None else "dict"
                break
    if sample_type == "dict" and not fmt.any_samples:
        _check_dict_samples(fmt, "dict")  # the one clear error
    spec = dataclasses.replace(spec, sample_type=sample_type)

    def samples() -> Iterator[Tuple[Sample, Any]]:
        for j, placeholder in enumerate(spec.samples):
            got = done.pop(j) if j in done else encoded(j)
            if isinstance(got, BadInputError):
                yield placeholder, got
                continue
            key, fields, label = got
            if sample_type == "classification" and label is None:
                raise _kind_error(key, fields, requested)
            yield _as_written(key, fields, label, sample_type, placeholder.files[0].path)

    return sample_type, fmt.write_shard(spec, samples())


def optimize(fn: Callable[[Any], Any], inputs: Iterable[Any], out: str, *, format: str = "wds",
             workers: Optional[int] = None, executor: Optional[cf.Executor] = None, samples_per_shard: int = 10000,
             min_shards: int = MIN_SHARDS, sample_type: str = "auto", classes: Optional[List[str]] = None,
             quality: int = QUALITY, decode: bool = False, prefix: str = "shard", overwrite: bool = False,
             progress: bool = False, storage_options: Optional[Dict[str, Any]] = None,
             compress: Optional[str] = None) -> ConvertResult:
    """Run ``fn`` over ``inputs`` in parallel and write what it returns into one output at
    ``out``, as LitData's ``optimize`` does; see the module doc.

    ``fn(input)`` returns one sample dict (or None: the input is skipped, and listed in the
    manifest). ``fn`` and the inputs are pickled to the workers: a module-level function. The
    inputs are cut into shards of ``samples_per_shard`` by index (spread over up to
    ``min_shards``), written by ``workers`` processes (default: the CPUs) or on ``executor`` (a
    ``dask.distributed`` client's, say): the same bytes for any. Started again after a kill, it
    keeps the finished shards of the same inputs and options and runs ``fn`` on the rest only;
    after a finished run, it returns the output as it is (``already_complete``). ``compress``:
    as :class:`Writer`'s. Returns a :class:`dsconvert.ConvertResult`.
    """
    if not callable(fn):
        raise OptionError(f"fn must be callable, not {type(fn).__name__}")
    fmt = _check_common(format, sample_type, quality, prefix, samples_per_shard, classes, decode, overwrite,
                        storage_options)
    check_positive("min_shards", min_shards)
    if workers is not None and (type(workers) is not int or workers < 1):
        raise OptionError(f"workers must be a positive int (or None: the CPUs), not {workers!r}")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise OptionError(f"executor must be a concurrent.futures.Executor (or None), not {type(executor).__name__}")
    check_flag("progress", progress)
    compression = check_compression(fmt, compress)
    decoded, format_options = _format_options(fmt, decode, classes, quality, sample_type, compression)
    items = list(inputs)
    workers = available_cpus() if workers is None else max(1, int(workers))
    name = _fn_name(fn)
    prints = [hashlib.sha256(_fingerprint(x, i)).hexdigest() for i, x in enumerate(items)]
    all_inputs = hashlib.sha256("".join(prints).encode()).hexdigest()
    options = {"writer": "optimize", "fn": name, "inputs": len(items), "inputs_sha256": all_inputs, "format": format,
               "samples_per_shard": samples_per_shard, "min_shards": min_shards, "prefix": prefix,
               "sample_type": sample_type, "quality": quality, "decode": decoded,
               **({"compress": compression_label(compression)} if compression else {})}
    url = f"python:{name}"
    placeholders = [Sample(f"{i:0{KEY_DIGITS}d}", (SourceFile("input", _input_path(i), 0, 0),))
                    for i in range(len(items))]
    ranges = spread_plan(placeholders, samples_per_shard, 1 << 62, min_shards, size_of=lambda s: 0)
    started = time.perf_counter()
    location = Location(local_form(out), storage_options)
    with open_output(location, overwrite) as output:
        previous = output.finished("output made with other options or inputs",
                                   reusable=lambda m: m.options == options and m.source.get("url") == url)
        if previous is not None:
            return ConvertResult(previous, location.url, already_complete=True)
        specs = []
        for index, (a, b) in enumerate(ranges):
            digest = hashlib.sha256("".join(prints[a:b]).encode()).hexdigest()
            specs.append(ShardSpec(fmt.id, index, fmt.shard_name(prefix, index), "", location.url,
                                   "classification" if sample_type == "auto" else sample_type,
                                   tuple(placeholders[a:b]), False, None, False,
                                   dict(format_options, fn=name, inputs_sha256=digest), dict(storage_options or {}),
                                   "files", (), output.owned.token))
        num_classes = len(classes) if classes is not None else None
        kinds = ("classification", "dict") if sample_type == "auto" else (sample_type,)

        def job(spec: ShardSpec) -> loop.Job:
            a, b = ranges[spec.index]
            return _optimize_shard, (spec, fn, items[a:b], a, sample_type, num_classes)

        def completed(spec: ShardSpec) -> Optional[Tuple[str, ShardResult]]:
            """An earlier run's shard of this spec, written as either sample type ``auto`` chose."""
            for kind in kinds:
                found = fmt.completed(dataclasses.replace(spec, sample_type=kind))
                if found is not None:
                    return kind, found
            return None

        with progress_bar(progress, f"writing {format}", total=len(items), unit=" inputs") as bar:
            done = loop.run_shards(specs, len(specs), job, workers=workers, executor=executor, bar=bar,
                                   owned=output.guarded, completed=completed, shard_result=lambda r: r[1])
        types = {t for t, r in done if r.entry.num_samples}
        if len(types) > 1:
            raise BadInputError("some shards hold (image, cls) samples and others dict samples: give every sample one "
                                "image field and an int cls, or pass sample_type='dict'")
        final = types.pop() if types else ("classification" if not fmt.any_samples or sample_type == "classification"
                                           else "dict")
        results = [r for _, r in done]
        manifest = _finish(output, fmt, prefix, url, final, list(classes) if classes is not None else None,
                           placeholders, results, options, decoded, compression)
    resumed = sum(r.resumed for r in results)
    return ConvertResult(manifest, location.url, False, len(results) - resumed, resumed,
                         time.perf_counter() - started, workers if executor is None else 0)
