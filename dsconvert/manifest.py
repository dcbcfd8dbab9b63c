"""The one schema that writers write and readers read: ``OUT/dsconvert.json``.

It is written last and atomically (temp file + ``os.replace``), so its presence means the
conversion finished. It lists every shard with its checksum, and every input file that is
not in the output with the reason, so that ``files_seen == files_written + files_skipped``.

Schema version 1::

    {
      "schema_version": 1,
      "format": "wds",                      # the format id: wds | hdf5 | npy
      "created_by": "dsconvert 0.1.0",
      "source": {"url": "/data/train", "layout": "imagefolder"},
      "sample_type": "classification",      # (image, label) tuples; or "dict"
      "stored": "encoded",                  # or "decoded": pixels (hdf5 --decode, npy)
      "classes": ["cat", "dog"],            # null when the source has none
      "fields": {"jpg": "image", "cls": "class"},
      "num_samples": 1234,
      "shards": [{"name": "shard-000000.tar", "index": "shard-000000.index.json",
                  "num_samples": 1000, "bytes": 123456, "sha256": "...",
                  # the shard's other files, checked wherever a copy of them is read
                  "parts": {"shard-000000.index.json": {"bytes": 5678, "sha256": "..."}}}],
      "skipped": [{"path": "cat/bad.jpg", "reason": "corrupt or truncated image: ..."},
                  # a run of rows of one container, one reason: dsconvert.skips
                  {"path": "train.parquet/rows 7-9", "reason": "no image (null)", "count": 3}],
      "ignored": [{"path": ".DS_Store", "reason": "hidden file or OS metadata"}],
      "accounting": {"files_seen": 1236, "files_written": 1234, "files_skipped": 2,
                     "files_ignored": 1},
      "options": {...},                     # the options that shaped the output
      "order": {"name": "dsconvert.order.npy", "bytes": 1234, "sha256": "..."},
      "compression": {"codec": "zstd", "level": 3, "fields": ["json", "npy"]}
    }

``order`` is null when the shards hold the samples in the source's order. Otherwise they hold
a seeded shuffle of it (``dsconvert shard --order``), and the named file, a ``.npy`` int64
array of ``num_samples``, gives for the i-th sample in source order its position in the shards
(shard by shard, in manifest order): how random access returns ImageFolder's sample i.

``compression`` is absent unless the output was written with ``--compress``: then it names the
codec, its level and the fields stored compressed (wds members ``<key>.<field>.zst``; each
shard's record says which column holds which field, and each member's size decompressed).
Readers decompress them and give the fields under their own names.

Paths in ``skipped``/``ignored`` are relative to the source root, escaped with
:func:`dsconvert.keys.escape_path` (only ``%`` and non-UTF-8 bytes) so the file is strict JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Union

from .errors import DsconvertError, ManifestError
from .io.location import Location, is_remote
from .keys import escape_path, unescape_path
from .samples import LAYOUTS

__all__ = ["SCHEMA_VERSION", "MANIFEST_NAME", "ORDER_NAME", "ShardEntry", "Manifest", "expect",
           "is_int", "is_str_list"]

SCHEMA_VERSION = 1
MANIFEST_NAME = "dsconvert.json"
ORDER_NAME = "dsconvert.order.npy"  # source position -> stored position, for shuffled outputs
SAMPLE_TYPES = ("classification", "dict")
STORED = ("encoded", "decoded")


@dataclass
class ShardEntry:
    name: str
    num_samples: int
    bytes: int
    sha256: str
    index: Optional[str] = None
    # the shard's other files (its index, npy's samples table): name -> {"bytes", "sha256"}, so
    # that a copy of any of them (a cache's, say) is checked before it is used
    parts: Dict[str, Dict[str, Any]] = field(default_factory=dict)


@dataclass
class Manifest:
    format: str
    source: Dict[str, Any]
    sample_type: str
    classes: Optional[List[str]]
    fields: Dict[str, str]
    num_samples: int
    shards: List[ShardEntry]
    skipped: List[Dict[str, str]] = field(default_factory=list)
    ignored: List[Dict[str, str]] = field(default_factory=list)
    accounting: Dict[str, int] = field(default_factory=dict)
    options: Dict[str, Any] = field(default_factory=dict)
    created_by: str = ""
    stored: str = "encoded"  # "decoded": the shards hold pixels (hdf5 --decode, npy)
    schema_version: int = SCHEMA_VERSION
    # shuffled outputs: {"name", "bytes", "sha256"} of the order file (module doc); None: source order
    order: Optional[Dict[str, Any]] = None
    # written with --compress: {"codec", "level", "fields": [the fields stored compressed]}; None: none
    compression: Optional[Dict[str, Any]] = None

    def identity(self) -> str:
        """A short digest of what the dataset holds (each shard's sha256 and sample count, the
        order file's): reading states carry it, so a state of another dataset is refused."""
        content = [[s.sha256, s.num_samples] for s in self.shards]
        blob = json.dumps([content, self.num_samples, (self.order or {}).get("sha256")]).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def own_files(self) -> List[str]:
        """The output's files besides its shards' (format.files_of): the manifest, the order file."""
        return [MANIFEST_NAME] + ([ORDER_NAME] if self.order is not None else [])

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        for name in ("order", "compression"):  # left out when unused, as before they existed
            if d[name] is None:
                d.pop(name)
        if self.classes is not None:  # folder names may hold undecodable bytes
            d["classes"] = [escape_path(c) for c in self.classes]
        # schema_version first: a reader of any version finds it at a glance
        return {"schema_version": d.pop("schema_version"), **d}

    @classmethod
    def from_dict(cls, d: Any, where: str = "manifest") -> Manifest:
        """Build from parsed JSON, naming the offending field when anything is off: a manifest
        is data from disk (hand-edited, truncated, hostile), and every field a reader or the
        CLI uses is checked here, so nothing downstream meets a list where it wants a string."""
        expect(isinstance(d, dict), where, "", "a JSON object")
        version = d.get("schema_version")
        expect(is_int(version) and version >= 1, where, "schema_version", "an integer >= 1")
        if version > SCHEMA_VERSION:
            raise ManifestError(
                f"{where}: schema_version {version} is newer than this dsconvert understands "
                f"({SCHEMA_VERSION}); upgrade dsconvert",
                where,
            )
        for name, kind, desc in (
            ("format", str, "a string"),
            ("source", dict, "an object"),
            ("sample_type", str, "a string"),
            ("fields", dict, "an object"),
            ("num_samples", int, "an integer"),
            ("shards", list, "a list"),
        ):
            expect(isinstance(d.get(name), kind) and not isinstance(d.get(name), bool), where, name, desc)
        expect(d["sample_type"] in SAMPLE_TYPES, where, "sample_type", f"one of {SAMPLE_TYPES}")
        expect(d["num_samples"] >= 0, where, "num_samples", ">= 0")
        expect(d.get("stored", "encoded") in STORED, where, "stored", f"one of {STORED}")
        _check_source(d["source"], where)
        expect(all(isinstance(v, str) for v in d["fields"].values()), where, "fields",
               "an object of field name -> kind (strings)")
        classes = d.get("classes")
        expect(
            classes is None or (isinstance(classes, list) and all(isinstance(c, str) for c in classes)),
            where, "classes", "null or a list of strings",
        )
        try:
            classes = None if classes is None else [unescape_path(c) for c in classes]
        except ValueError:
            expect(False, where, "classes", "a list of names with well-formed %-escapes")
        shards = []
        for i, s in enumerate(d["shards"]):
            shards.append(_shard_entry(s, where, f"shards[{i}]"))
        total = sum(s.num_samples for s in shards)
        expect(total == d["num_samples"], where, "num_samples", f"the sum over shards ({total})")
        for name in ("skipped", "ignored"):
            items = d.get(name, [])
            expect(
                isinstance(items, list) and all(isinstance(x, dict) and isinstance(x.get("path"), str)
                                                and isinstance(x.get("reason"), str)
                                                and is_int(x.get("count", 1)) and x.get("count", 1) >= 1
                                                for x in items),
                where, name, "a list of {path, reason[, count >= 1]} objects",
            )
        accounting = d.get("accounting", {})
        expect(isinstance(accounting, dict) and all(is_int(v) and v >= 0 for v in accounting.values()),
               where, "accounting", "an object of counts (integers >= 0)")
        options = d.get("options", {})
        expect(isinstance(options, dict), where, "options", "an object")
        _check_options(options, where)
        created_by = d.get("created_by", "")
        expect(isinstance(created_by, str), where, "created_by", "a string")
        order = d.get("order")
        expect(order is None or (isinstance(order, dict) and order.get("name") == ORDER_NAME
                                 and is_int(order.get("bytes")) and order["bytes"] >= 0
                                 and is_sha256(order.get("sha256"))),
               where, "order", f'null or {{"name": "{ORDER_NAME}", "bytes", "sha256"}}')
        compression = d.get("compression")
        expect(compression is None or (isinstance(compression, dict) and isinstance(compression.get("codec"), str)
                                       and is_int(compression.get("level"))
                                       and is_str_list(compression.get("fields"))),
               where, "compression", 'null or {"codec", "level", "fields": [names]}')
        return cls(
            format=d["format"],
            source=d["source"],
            sample_type=d["sample_type"],
            classes=classes,
            fields=d["fields"],
            num_samples=d["num_samples"],
            shards=shards,
            skipped=d.get("skipped", []),
            ignored=d.get("ignored", []),
            accounting=accounting,
            options=options,
            created_by=created_by,
            stored=d.get("stored", "encoded"),
            schema_version=version,
            order=order,
            compression=compression,
        )

    def save(self, out_dir: Union[str, Location], before: Optional[Callable[[str], None]] = None) -> str:
        """Write the manifest into ``out_dir`` (a path, URL or Location), atomically;
        ``before``: as :meth:`Location.write`'s (the output journals the temporary name)."""
        loc = out_dir if isinstance(out_dir, Location) else Location(out_dir)
        loc.write_json(MANIFEST_NAME, self.to_dict(), before)
        return loc.url_of(MANIFEST_NAME)

    @classmethod
    def load(cls, path: Union[str, Location], storage_options: Optional[Dict[str, Any]] = None) -> Manifest:
        """Load ``path``: the manifest file, or the output folder (path, URL or Location)
        holding it."""
        if isinstance(path, Location):
            loc, name = path, MANIFEST_NAME
        elif path.endswith(".json") and (is_remote(path) or not os.path.isdir(path)):
            folder, name = path.rsplit("/", 1) if is_remote(path) else os.path.split(os.path.abspath(path))
            loc = Location(folder, storage_options)
        else:
            loc, name = Location(path, storage_options), MANIFEST_NAME
        where = loc.url_of(name)
        try:
            raw = loc.read_bytes(name)
        except FileNotFoundError:
            raise ManifestError(_missing(loc), where) from None
        except OSError as exc:
            if loc.remote or isinstance(exc, DsconvertError):  # the storage client's own error says more
                raise
            raise ManifestError(_unreadable(loc.url, where, exc), where) from None
        return cls.from_bytes(raw, where)

    @classmethod
    def from_bytes(cls, raw: bytes, where: str = "manifest") -> Manifest:
        """Parse a manifest file's bytes (read from ``where``, named in errors)."""
        try:
            d = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError included
            raise ManifestError(f"{where}: not valid JSON ({exc})", where) from None
        except RecursionError:  # "[[[[..." deeper than the interpreter's stack
            raise ManifestError(f"{where}: not a manifest (JSON nested too deeply)", where) from None
        return cls.from_dict(d, where=where)


def _missing(loc: Location) -> str:
    """Why a folder has no manifest, in the words that tell the user what to do: it does not
    exist; a conversion is writing it now (its lock is held: the manifest comes last); one
    stopped before it finished (its control files are there: run it again); or it is not an
    output. A remote one is not asked (object stores hold no lock)."""
    from .io.locks import lock_held
    from .io.owner import LOCK_NAME, OWNER_NAME

    folder = loc.url
    if loc.remote:
        return (f"no {MANIFEST_NAME} at {folder}: not a dsconvert output, or its conversion has not finished "
                "(a conversion writes it last)")
    if not os.path.lexists(folder):
        return f"{folder} does not exist (expected a dsconvert output folder)"
    if not os.path.isdir(folder):
        return f"{folder} is a file, not a dsconvert output folder"
    if lock_held(os.path.join(folder, LOCK_NAME)):
        return (f"no {MANIFEST_NAME} at {folder} yet: a conversion is writing it now (the manifest is written "
                "last); open it once that conversion has finished")
    if any(os.path.lexists(os.path.join(folder, n)) for n in (LOCK_NAME, OWNER_NAME)):
        return (f"no {MANIFEST_NAME} at {folder}: the conversion writing it stopped before it finished (killed, or "
                "it failed); run the same `dsconvert shard` command (or Writer) again to resume it")
    return f"no {MANIFEST_NAME} at {folder}: not a dsconvert output"


def _unreadable(folder: str, where: str, exc: OSError) -> str:
    """Why a local manifest cannot be read, in words that name the path."""
    if isinstance(exc, NotADirectoryError) or (os.path.exists(folder) and not os.path.isdir(folder)):
        return f"{folder} is a file, not a dsconvert output folder"
    if isinstance(exc, PermissionError):
        return f"cannot read {where}: permission denied"
    if isinstance(exc, IsADirectoryError):
        return f"{where} is a folder, not a manifest file"
    return f"cannot read {where}: {exc.strerror or exc}"


def _check_source(source: Dict[str, Any], where: str) -> None:
    """``source``: url, root and layout are strings when present (verify rescans with them), and
    so is chosen (info prints it)."""
    for key in ("url", "root", "layout", "chosen"):
        expect(key not in source or isinstance(source[key], str), where, f"source.{key}", "a string")
    expect(source.get("layout", "auto") in LAYOUTS, where, "source.layout", f"one of {LAYOUTS}")


def _check_options(options: Dict[str, Any], where: str) -> None:
    """The options that readers, ``verify`` and ``info`` use; the others are compared as they are."""
    size = options.get("size")
    for key, ok, what in (
        ("prefix", isinstance(options.get("prefix", ""), str), "a string"),
        ("decoder", options.get("decoder") is None or isinstance(options["decoder"], str), "null or a string"),
        ("resize", options.get("resize") is None or (is_int(options["resize"]) and options["resize"] >= 1),
         "null or an integer >= 1"),
        ("size", size is None
         or (isinstance(size, list) and len(size) == 2 and all(is_int(v) and v >= 1 for v in size)),
         "null or [height, width]"),
        ("max_size", options.get("max_size") is None or (is_int(options["max_size"]) and options["max_size"] >= 1),
         "null or an integer >= 1"),
        ("quality", options.get("quality") is None or (is_int(options["quality"]) and 1 <= options["quality"] <= 100),
         "null or an integer within 1..100"),
        ("jpeg_restart", isinstance(options.get("jpeg_restart", False), bool), "true or false"),
    ):
        expect(ok, where, f"options.{key}", what)


def _shard_entry(s: Any, where: str, at: str) -> ShardEntry:
    from .io.localfs import check_name

    expect(isinstance(s, dict), where, at, "an object")
    for name, kind in (("name", str), ("num_samples", int), ("bytes", int), ("sha256", str)):
        expect(isinstance(s.get(name), kind) and not isinstance(s.get(name), bool), where, f"{at}.{name}",
               kind.__name__)
    parts = s.get("parts", {})
    expect(isinstance(parts, dict), where, f"{at}.parts", "an object of file name -> {bytes, sha256}")
    for label, name in [("name", s["name"]), ("index", s.get("index"))] + [("parts", p) for p in parts]:
        if name is None and label == "index":
            continue
        try:
            check_name(name)
        except ManifestError:
            expect(False, where, f"{at}.{label}", "a plain file name: letters, digits, '_', '.', '-' (no "
                   f"separators, no %-escapes), not {name!r}")
    expect(s["num_samples"] >= 0 and s["bytes"] >= 0, where, at, "non-negative counts")
    expect(is_sha256(s["sha256"]), where, f"{at}.sha256", "64 hex digits")
    index = s.get("index")
    expect(all(
        isinstance(p, dict) and is_int(p.get("bytes")) and p["bytes"] >= 0 and is_sha256(p.get("sha256"))
        for p in parts.values()), where, f"{at}.parts", "an object of file name -> {bytes, sha256}")
    return ShardEntry(s["name"], s["num_samples"], s["bytes"], s["sha256"], index, parts)


def is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def is_int(value: Any) -> bool:
    """A JSON integer (``True`` is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_int_list(values: Any, n: Optional[int] = None, minimum: Optional[int] = None) -> bool:
    """A list of ``n`` JSON integers >= ``minimum``: checked in C (``map(type)``), since shard
    records hold one per sample and are read by every worker, every epoch."""
    return (isinstance(values, list) and (n is None or len(values) == n) and set(map(type, values)) <= {int}
            and (minimum is None or not values or min(values) >= minimum))


def is_str_list(value: Any, length: Optional[int] = None) -> bool:
    """A list of ``length`` strings, checked in C as :func:`is_int_list` is (a str subclass
    cannot come out of JSON)."""
    return (isinstance(value, list) and (length is None or len(value) == length)
            and set(map(type, value)) <= {str})


def is_list_of_lists(value: Any, n: int) -> bool:
    """A list of ``n`` lists (what they hold is the caller's to check), in C as above."""
    return isinstance(value, list) and len(value) == n and set(map(type, value)) <= {list}


def expect(ok: bool, where: str, name: str, what: str) -> None:
    """Raise a ManifestError naming the field of ``where`` that is not ``what``."""
    if not ok:
        label = f"field '{name}'" if name else "the document"
        raise ManifestError(f"{where}: {label} must be {what}", where)
