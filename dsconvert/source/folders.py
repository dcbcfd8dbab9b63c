"""Folders and list files scanned into an ordered list of samples, without reading file contents.

Three layouts, detected automatically (or named with ``layout=``):

``imagefolder``
    ``root/<class>/**/<image>``. Class names are the sorted top-level folder names and give
    label indices exactly as ``torchvision.datasets.ImageFolder``; files come in the order
    of ``sorted(os.walk(class_dir, followlinks=True))`` then sorted names, as there. Every
    image file is its own sample. Chosen when the root holds folders and no images, and no
    image under them has a sidecar file of the same stem.
``flat``
    Files anywhere under root, grouped into samples by stem (the relative path minus its
    *last* extension): ``shot.v2.0001.jpg`` + ``shot.v2.0001.json`` is one sample with
    fields ``jpg`` and ``json``. Field names are the lower-cased extensions.
``list``
    A CSV/TSV (``path,label``, header optional) or JSONL (``{"path": ..., "label": ...}``)
    file; relative paths are relative to the list file's folder; labels are integers, or
    class names which are then sorted into indices. Samples keep the list's order.

Hidden files and folders (a leading dot) and OS litter (``Thumbs.db``, ``__MACOSX``...) are
*ignored*: listed, but not inputs. Everything else is an input and ends up either in a
sample or in ``skipped`` with its reason: non-regular files, broken symlinks, symlink
loops, files without an extension, non-images inside an ImageFolder, missing list entries.
Symlinks to files and folders are followed; a link back to an ancestor folder is not.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import marshal
import os
import re
import stat as stat_mod
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, Iterator, List, Optional, Tuple, Union

from ..codecs import IMAGE_EXTENSIONS, is_image_field
from ..errors import SourceError
from ..io.location import filesystem, is_remote, mtime_ns_of
from ..keys import disambiguate, encode_key, escape_path, is_utf8
from ..samples import LABEL_MAX, Sample, Skipped, Source, SourceFile
from ..scan_table import ScanTable

__all__ = ["scan_files", "FolderListing", "looks_like_image_folder", "is_ignored", "source_of_listings",
           "LIST_SUFFIXES", "ProgressFn"]

LIST_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")
OS_LITTER = frozenset(
    {"Thumbs.db", "ehthumbs.db", "desktop.ini", "Desktop.ini", "__MACOSX", "@eaDir",
     "$RECYCLE.BIN", "System Volume Information", "lost+found", "Icon\r"}
)


ProgressFn = Callable[[int], None]


def is_ignored(name: str) -> bool:
    return name.startswith(".") or name in OS_LITTER


def _split_ext(name: str) -> Tuple[str, str]:
    stem, dot, ext = name.rpartition(".")
    return (stem, ext) if dot and stem else (name, "")


@dataclass
class FolderListing:
    """One folder's files, as the walkers see it (the layout test needs no more)."""

    rel: str  # "" for the root
    files: Sequence[Tuple[str, int, int]]  # (name, size, mtime_ns), sorted by name


class _SpooledFiles(Sequence[Tuple[str, int, int]]):
    """A walked folder's files, kept in the walk's spool file until asked for: a walk of
    millions of files holds one folder's names at a time, not the tree's."""

    def __init__(self, spool: Any, offset: int, length: int, count: int):
        self.spool, self.offset, self.length, self.files = spool, offset, length, count

    def _load(self) -> List[Tuple[str, int, int]]:
        return marshal.loads(os.pread(self.spool.fileno(), self.length, self.offset))

    def __len__(self) -> int:
        return self.files

    def __iter__(self) -> Iterator[Tuple[str, int, int]]:
        return iter(self._load())

    def __getitem__(self, index: Any) -> Any:
        return self._load()[index]




class _Walker:
    """scandir-based walk that follows symlinks, refuses loops and records what it drops."""

    def __init__(self, root: str, progress: Optional[ProgressFn], spool: bool = True):
        self.root = root
        self.progress = progress
        self.skipped: List[Skipped] = []
        self.ignored: List[Skipped] = []
        # each folder's listing goes to an unnamed file (gone with the last listing that reads it)
        self.spool = tempfile.TemporaryFile(prefix="dsconvert-walk-") if spool else None
        self.spooled = 0

    def walk(self, rel: str = "") -> List[FolderListing]:
        top = os.path.join(self.root, rel) if rel else self.root
        st = os.stat(top)
        dirs: List[FolderListing] = []
        self._walk(rel, {(st.st_dev, st.st_ino)}, dirs)
        dirs.sort(key=lambda d: d.rel)
        return dirs

    def _walk(self, rel: str, ancestors: set, out: List[FolderListing]) -> None:
        path = os.path.join(self.root, rel) if rel else self.root
        files: List[Tuple[str, int, int]] = []
        subdirs: List[Tuple[str, Tuple[int, int]]] = []
        try:
            entries = list(os.scandir(path))
        except OSError as exc:
            if not rel:  # the source itself: nothing to convert, and "no samples found" would hide why
                raise SourceError(f"cannot read the source folder {path}: "
                                  f"{(exc.strerror or str(exc)).lower()}", path) from None
            self.skipped.append(Skipped(rel, f"unreadable folder: {exc.strerror}"))
            return
        for entry in entries:
            name = entry.name
            relpath = f"{rel}/{name}" if rel else name
            if is_ignored(name):
                self.ignored.append(Skipped(relpath, "hidden file or OS metadata"))
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    reason = "symlink loop"
                elif entry.is_symlink() and exc.errno == errno.ENOENT:
                    reason = "broken symlink"
                else:
                    reason = f"cannot stat: {exc.strerror}"
                self.skipped.append(Skipped(relpath, reason))
                continue
            if stat_mod.S_ISDIR(st.st_mode):
                ident = (st.st_dev, st.st_ino)
                if ident in ancestors:
                    self.skipped.append(Skipped(relpath, "symlink loop: links to an ancestor folder"))
                else:
                    subdirs.append((relpath, ident))
            elif stat_mod.S_ISREG(st.st_mode):
                files.append((name, st.st_size, st.st_mtime_ns))
            else:
                self.skipped.append(Skipped(relpath, "not a regular file"))
        files.sort()
        if self.progress is not None:
            self.progress(len(files))
        if self.spool is not None:
            raw = marshal.dumps(files)
            os.pwrite(self.spool.fileno(), raw, self.spooled)
            out.append(FolderListing(rel, _SpooledFiles(self.spool, self.spooled, len(raw), len(files))))
            self.spooled += len(raw)
        else:
            out.append(FolderListing(rel, files))
        del files, entries
        for sub, ident in subdirs:
            self._walk(sub, ancestors | {ident}, out)


def _samples(on_disk: bool) -> Any:
    """Where a scan puts its samples: a table on disk (a conversion's scan), or a list (a
    small part of a source, analyze's, which it shuffles in place)."""
    return ScanTable() if on_disk else []


def _image_folder(root: str, walker: _Walker, dirs: Sequence[FolderListing], on_disk: bool = True) -> Source:
    top = dirs[0]
    classes = sorted({d.rel.split("/", 1)[0] for d in dirs[1:]})
    label_of = {c: i for i, c in enumerate(classes)}
    for name, _, _ in top.files:
        walker.skipped.append(Skipped(name, "not inside a class folder"))
    samples = _samples(on_disk)
    # class by class (sorted), then sorted(os.walk(class_dir)) within it, as torchvision
    for d in sorted(dirs[1:], key=lambda d: (d.rel.split("/", 1)[0], d.rel)):
        label = label_of[d.rel.split("/", 1)[0]]
        images = []
        for n, size, mtime in d.files:
            stem, ext = _split_ext(n)
            if is_image_field(ext):
                images.append((stem, ext, n, size, mtime))
            else:
                walker.skipped.append(
                    Skipped(f"{d.rel}/{n}", f"not an image file (looked for {', '.join(IMAGE_EXTENSIONS)})")
                )
        stem_count: Dict[str, int] = {}
        for stem, *_ in images:
            stem_count[stem] = stem_count.get(stem, 0) + 1
        for stem, ext, n, size, mtime in images:
            key = encode_key(f"{d.rel}/{stem}")
            if stem_count[stem] > 1:  # a.jpg and a.png: two samples, as in ImageFolder
                key = disambiguate(key, ext)
            files = (SourceFile(ext.lower(), f"{d.rel}/{n}", size, mtime),)
            samples.append(Sample(key, files, label))
    return Source(root, "imagefolder", samples, classes, walker.skipped, walker.ignored)


def _flat(root: str, walker: _Walker, dirs: Sequence[FolderListing], on_disk: bool = True) -> Source:
    samples = _samples(on_disk)
    for d in dirs:
        groups: Dict[str, List[Tuple[str, str, int, int]]] = {}
        for n, size, mtime in d.files:
            stem, ext = _split_ext(n)
            relpath = f"{d.rel}/{n}" if d.rel else n
            if not ext:
                walker.skipped.append(Skipped(relpath, "no file extension, so no field name"))
                continue
            if not is_utf8(ext) or not ext.isprintable():
                # the field name goes into tar member names and the manifest as text
                walker.skipped.append(Skipped(relpath, "file extension is not printable UTF-8 text, so no field name"))
                continue
            groups.setdefault(stem, []).append((ext.lower(), relpath, size, mtime))
        for stem in sorted(groups):
            files: List[SourceFile] = []
            seen: Dict[str, str] = {}
            for fld, relpath, size, mtime in groups[stem]:
                if fld in seen:
                    walker.skipped.append(
                        Skipped(relpath, f"duplicate field '{fld}' in one sample (also {seen[fld]})")
                    )
                    continue
                seen[fld] = relpath
                files.append(SourceFile(fld, relpath, size, mtime))
            key = encode_key(f"{d.rel}/{stem}" if d.rel else stem)
            samples.append(Sample(key, tuple(sorted(files, key=lambda f: f.field))))
    return Source(root, "flat", samples, None, walker.skipped, walker.ignored)


def looks_like_image_folder(dirs: Sequence[FolderListing]) -> bool:
    """ImageFolder when the root holds folders and no images, and no image under them has a
    sidecar of the same stem; ``dirs[0]`` is the root."""
    top = dirs[0]
    if len(dirs) < 2 or any(is_image_field(_split_ext(n)[1]) for n, _, _ in top.files):
        return False
    for d in dirs[1:]:
        by_stem: Dict[str, List[str]] = {}
        for n, _, _ in d.files:
            stem, ext = _split_ext(n)
            by_stem.setdefault(stem, []).append(ext)
        for exts in by_stem.values():
            if len(exts) > 1 and any(is_image_field(e) for e in exts) and not all(
                is_image_field(e) for e in exts
            ):
                return False  # an image with a sidecar: that is a flat dataset
    return any(is_image_field(_split_ext(n)[1]) for d in dirs[1:] for n, _, _ in d.files)


_INT = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() also takes "٣" and "1_000"


def _decode_list(path: str, raw: bytes) -> str:
    """A list file's text: UTF-8 (a BOM is dropped), or a SourceError naming the line."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        lineno = raw.count(b"\n", 0, exc.start) + 1
        raise SourceError(f"{path}:{lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02X}); save the list "
                          "file as UTF-8", path) from None


def _json_row(path: str, lineno: int, line: str) -> Tuple[int, str, str]:
    """One JSONL line as (line number, path, label text); a SourceError naming the line."""
    try:
        obj = json.loads(line)
    except ValueError as exc:
        raise SourceError(f"{path}:{lineno}: not valid JSON ({exc})", path) from None
    except RecursionError:
        raise SourceError(f"{path}:{lineno}: JSON nested too deeply", path) from None
    if not isinstance(obj, dict) or "path" not in obj or "label" not in obj:
        raise SourceError(f"{path}:{lineno}: expected a JSON object with 'path' and 'label'", path)
    rel, label = obj["path"], obj["label"]
    if not isinstance(rel, str) or not rel:
        raise SourceError(f"{path}:{lineno}: 'path' must be a non-empty string, not {_short(rel)}", path)
    if isinstance(label, bool) or not isinstance(label, (int, str)):
        raise SourceError(f"{path}:{lineno}: 'label' must be an integer or a class name (a string), "
                          f"not {_short(label)}", path)
    return lineno, rel, str(label)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _read_list(path: str, f: IO[str]) -> Iterator[Tuple[int, str, str]]:
    """Rows of a list file (``f``: its text, read with ``newline=""``) as (line number, path,
    label text), one at a time."""
    if path.lower().endswith((".jsonl", ".ndjson")):
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield _json_row(path, lineno, line)
        return
    dialect = "excel-tab" if path.lower().endswith(".tsv") else "excel"
    reader = csv.reader(f, dialect=dialect)
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or not "".join(row).strip():
                continue
            if len(row) < 2:
                raise SourceError(f"{path}:{lineno}: expected 'path,label', got {_short(row)}", path)
            if lineno == 1 and row[0].strip().lower() in ("path", "file", "filename", "image"):
                continue  # a header
            yield lineno, row[0].strip(), row[1].strip()
    except csv.Error as exc:  # a field over csv's size limit, say
        raise SourceError(f"{path}:{reader.line_num}: not a valid CSV row ({exc})", path) from None


class _ListFile:
    """A list file read as text as many times as the scan needs, never whole: checked to be
    UTF-8 first (an error names its line, as reading it whole did)."""

    def __init__(self, list_path: str, open_binary: Callable[[], IO[bytes]]):
        self.path = list_path
        self.open_binary = open_binary
        with self.rows() as rows:
            try:
                for _ in rows.text:
                    pass
            except UnicodeDecodeError:
                with open_binary() as f:
                    _decode_list(list_path, f.read())  # raises, naming the line
                raise

    @contextlib.contextmanager
    def rows(self) -> Iterator[Any]:
        with self.open_binary() as raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as text:
            yield _Rows(self.path, text)


class _Rows:
    def __init__(self, path: str, text: IO[str]):
        self.text = text
        self.path = path

    def __iter__(self) -> Iterator[Tuple[int, str, str]]:
        return _read_list(self.path, self.text)


_STAT_BATCH = 1024  # list entries stat'ed at a time (remote ones concurrently)


def _stat_local(base: str, rels: Sequence[str]) -> List[Union[Tuple[int, int], str]]:
    out: List[Union[Tuple[int, int], str]] = []
    for rel in rels:
        try:
            st = os.stat(rel if os.path.isabs(rel) else os.path.join(base, rel))
        except OSError as exc:
            out.append((exc.strerror or str(exc)).lower())
            continue
        out.append((st.st_size, st.st_mtime_ns) if stat_mod.S_ISREG(st.st_mode) else "not a regular file")
    return out


def _stat_remote(fs: Any, base: str, rels: Sequence[str]) -> List[Union[Tuple[int, int], str]]:
    """Each entry's (size, mtime_ns), many requests at once (each one is a round trip)."""
    def one(rel: str) -> Union[Tuple[int, int], str]:
        if rel.startswith("/") or "://" in rel:
            return "absolute paths are not supported in a remote list file"
        try:
            info = fs.info(f"{base}/{rel}")
        except FileNotFoundError:
            return "no such file or directory"
        except OSError as exc:
            return f"unreadable: {exc}"
        return (int(info.get("size") or 0), mtime_ns_of(info)) if info.get("type") == "file" else "not a regular file"

    with ThreadPoolExecutor(max_workers=32) as pool:
        return list(pool.map(one, rels))


def _list(list_path: str, storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """A list file's samples, its rows read a few times over and never held: whether every
    label is an integer (and in range), the class names otherwise, then the samples, their
    files stat'ed a batch at a time."""
    if is_remote(list_path):
        fs, path = filesystem(list_path, storage_options)
        base = list_path.rsplit("/", 1)[0]
        listed = _ListFile(list_path, lambda: fs.open(path, "rb"))
        stat = lambda rels: _stat_remote(fs, path.rsplit("/", 1)[0], rels)  # noqa: E731
    else:
        base = os.path.dirname(list_path)
        listed = _ListFile(list_path, lambda: open(list_path, "rb"))
        stat = lambda rels: _stat_local(base, rels)  # noqa: E731
    count, all_int = 0, True
    out_of_range: Optional[Tuple[int, str]] = None  # the first integer label past int64, in row order
    with listed.rows() as rows:
        for lineno, _, label in rows:
            count += 1
            if not all_int:
                continue
            if not _is_int(label):
                all_int = False
            elif out_of_range is None and not 0 <= int(label) <= LABEL_MAX:
                out_of_range = (lineno, label)
    if not count:
        raise SourceError(f"the list file {list_path} has no entries", list_path)
    classes: Optional[List[str]] = None
    label_index: Dict[str, int] = {}
    if all_int:
        if out_of_range is not None:
            lineno, label = out_of_range
            shown = label if len(label) <= 24 else label[:21] + "..."
            raise SourceError(f"{list_path}:{lineno}: label {shown} is out of range: integer labels are "
                              f"class indices, 0 to {LABEL_MAX} (int64)", list_path)
    else:
        with listed.rows() as rows:
            classes = sorted({label for _, _, label in rows})
        label_index = {c: i for i, c in enumerate(classes)}
    width = max(6, len(str(count - 1)))
    samples = ScanTable()
    skipped: List[Skipped] = []  # not images, in row order; then those that could not be stat'ed
    unreadable: List[Skipped] = []
    batch: List[Tuple[int, int, str, str, str]] = []

    def add(batch: List[Tuple[int, int, str, str, str]]) -> None:
        for (i, lineno, rel, label, ext), st in zip(batch, stat([img[2] for img in batch])):
            if isinstance(st, str):
                unreadable.append(Skipped(rel, f"line {lineno}: {st}"))
                continue
            samples.append(Sample(f"{i:0{width}d}", (SourceFile(ext, rel, st[0], st[1]),),
                                  int(label) if all_int else label_index[label]))

    with listed.rows() as rows:
        for i, (lineno, rel, label) in enumerate(rows):
            ext = _split_ext(rel.rsplit("/", 1)[-1])[1]
            if not is_image_field(ext):
                skipped.append(Skipped(rel, f"line {lineno}: not an image file"))
                continue
            batch.append((i, lineno, rel, label, ext.lower()))
            if len(batch) >= _STAT_BATCH:
                add(batch)
                batch = []
    add(batch)
    skipped += unreadable
    return Source(base, "list", samples, classes, skipped, [])


def _is_int(text: str) -> bool:
    """An integer label in ASCII digits (up to 4300 of them: int()'s limit)."""
    return len(text) <= 4300 and _INT.fullmatch(text) is not None


class _Listed:
    """What a listing left out (the walkers' ``skipped`` and ``ignored``)."""

    def __init__(self) -> None:
        self.skipped: List[Skipped] = []
        self.ignored: List[Skipped] = []


def _remote_dirs(fs: Any, root: str, progress: Optional[ProgressFn]) -> Tuple[List[FolderListing], _Listed]:
    """Folder listings of a remote tree from one batched listing (``find``: S3 lists up to
    1000 keys per request, every folder at once), root first."""
    listed = _Listed()
    folders: Dict[str, List[Tuple[str, int, int]]] = {"": []}
    for full, info in sorted(fs.find(root, withdirs=False, detail=True).items()):
        rel = full[len(root):].strip("/")
        if not rel:
            continue
        if any(is_ignored(part) for part in rel.split("/")):
            listed.ignored.append(Skipped(rel, "hidden file or OS metadata"))
            continue
        folder, _, name = rel.rpartition("/")
        folders.setdefault(folder, []).append((name, int(info.get("size") or 0), mtime_ns_of(info)))
    dirs = [FolderListing(rel, sorted(files)) for rel, files in sorted(folders.items())]
    if progress is not None:
        progress(sum(len(d.files) for d in dirs))
    return dirs, listed


def scan_files(src: str, layout: str = "auto", progress: Optional[ProgressFn] = None,
               storage_options: Optional[Dict[str, Any]] = None) -> Source:
    """A folder or list file (a path, or a URL fsspec reaches; ``layout`` imagefolder, flat,
    list or auto) scanned into a :class:`Source`, reading no contents; ``progress`` is called
    with the number of files found in each folder walked."""
    if is_remote(src):
        return _scan_remote(src.rstrip("/"), layout, progress, storage_options)
    if not os.path.exists(src):
        raise SourceError(f"source does not exist: {escape_path(src)}", src)
    src = os.path.abspath(src)
    if not is_utf8(src):
        raise SourceError(
            f"the source path {escape_path(src)} (undecodable bytes shown as %XX) is not valid UTF-8, and the "
            "manifest records it as text: rename it, or reach it through a symlink with a UTF-8 name", src)
    if os.path.isfile(src):
        if layout in ("auto", "list") and src.lower().endswith(LIST_SUFFIXES):
            return _list(src)
        if layout == "list":
            return _list(src)
        raise SourceError(
            f"{src} is a file; a list source must end in {', '.join(LIST_SUFFIXES)}", src
        )
    if layout == "list":
        raise SourceError(f"layout 'list' needs a list file, and {src} is a folder", src)
    walker = _Walker(src, progress)
    return _from_listing(src, layout, walker, walker.walk())


def _scan_remote(url: str, layout: str, progress: Optional[ProgressFn],
                 storage_options: Optional[Dict[str, Any]]) -> Source:
    fs, root = filesystem(url, storage_options)
    try:
        info = fs.info(root)
    except FileNotFoundError:
        raise SourceError(f"source does not exist: {url}", url) from None
    if info.get("type") == "file":
        if layout in ("auto", "list") and url.lower().endswith(LIST_SUFFIXES):
            return _list(url, storage_options)
        raise SourceError(f"{url} is a file; a list source must end in {', '.join(LIST_SUFFIXES)}", url)
    if layout == "list":
        raise SourceError(f"layout 'list' needs a list file, and {url} is a folder", url)
    dirs, listed = _remote_dirs(fs, root, progress)
    return _from_listing(url, layout, listed, dirs)


def source_of_listings(src: str, dirs: List[FolderListing], layout: str = "auto") -> Source:
    """The :class:`Source` that folder listings already taken (the root's first) describe:
    analyze builds its measured sample this way from part of its inventory, without a
    second walk of the tree."""
    return _from_listing(src, layout, _Listed(), dirs, on_disk=False)


def _from_listing(src: str, layout: str, walker: Any, dirs: List[FolderListing], on_disk: bool = True) -> Source:
    if layout == "auto":
        layout = "imagefolder" if looks_like_image_folder(dirs) else "flat"
    if layout == "imagefolder":
        source = _image_folder(src, walker, dirs, on_disk)
    else:
        source = _flat(src, walker, dirs, on_disk)
    if not source.samples:
        raise SourceError(
            f"no samples found in {src} (layout {layout}; images are {', '.join(IMAGE_EXTENSIONS)})",
            src,
        )
    return source
