"""Putting it together: :func:`detect` walks the path, sniffs a bounded sample of its files,
names the dominant kind by bytes, and has it described; dsconvert outputs are named by their
manifests."""

from __future__ import annotations

import json
import os
import posixpath
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

from ...codecs import is_image_field
from ...manifest import MANIFEST_NAME, Manifest
from . import limits
from .describe import describe
from .kinds import READERS, Detected, count_files, plain_kind, short_error
from .sniffers import Sniff, hint_of, sniff
from .walk import Entry, Store, Walk, name_list, walk_tree

__all__ = ["detect"]


def detect(path: str, fs: Any = None) -> Detected:
    """What ``path`` holds (a local path, or a path within ``fs``, an fsspec file system), from
    headers: see the module doc. Never raises."""
    store = Store(fs)
    try:
        kind, size = store.info(path)
    except Exception as exc:
        return Detected(path, "unknown", f"cannot read {path}: {short_error(exc)}")
    try:
        if kind == "dir":
            return _detect_folder(store, path)
        if kind != "file":
            return Detected(path, "unknown", f"{path} is not a regular file or folder")
        name = posixpath.basename(path.rstrip("/")) if fs is not None else os.path.basename(path)
        folder = path.rstrip("/").rsplit("/", 1)[0] if fs is not None else os.path.dirname(os.path.abspath(path))
        if name == MANIFEST_NAME:  # the manifest names its folder
            return _detect_folder(store, folder)
        found = _detect_entries(store, path, [Entry(name, path, size)], Walk(), single=True)
        try:
            store.info(store.join(folder, MANIFEST_NAME))
        except Exception:
            return found
        found.description += (f"; one file of the dsconvert output in {folder} "
                              "(read it whole with dsconvert.open_dataset)")
        return found
    except Exception as exc:  # a bug's last line of defence: say so rather than crash analyze
        return Detected(path, "unknown", f"could not be recognised ({type(exc).__name__}: {short_error(exc)})")


def _detect_folder(store: Store, root: str) -> Detected:
    walk = walk_tree(store, root)
    top = [e for e in walk.entries if "/" not in e.rel]
    if any(e.name == MANIFEST_NAME for e in top):
        found = _dsconvert(store, root, walk)
        if found is not None:
            return found
    nested = [e.rel.rsplit("/", 1)[0] for e in walk.entries if e.name == MANIFEST_NAME and "/" in e.rel]
    if nested:
        return _nested_outputs(store, root, walk, sorted(nested)[:limits.MAX_NESTED])
    return _detect_entries(store, root, walk.entries, walk)


def _nested_outputs(store: Store, root: str, walk: Walk, folders: List[str]) -> Detected:
    """Outputs in subfolders (train/ and val/, say): each named by its manifest, the rest by content,
    and the one holding more bytes is the answer."""
    outs: List[Tuple[str, Detected]] = []
    rest = list(walk.entries)
    for folder in folders:
        if any(folder.startswith(f + "/") for f, _ in outs):
            continue  # an output copied inside another: that one's stray files
        prefix = folder + "/"
        sub = Walk([Entry(e.rel[len(prefix):], e.path, e.size) for e in rest if e.rel.startswith(prefix)],
                    complete=walk.complete)
        found = _dsconvert(store, store.join(root, folder), sub)
        if found.kind != "dsconvert":
            continue  # a manifest that does not load: its files are judged by content with the rest
        outs.append((folder, found))
        rest = [e for e in rest if not e.rel.startswith(prefix)]
    if not outs:
        return _detect_entries(store, root, walk.entries, walk)
    inside = sum(e.size for e in walk.entries) - sum(e.size for e in rest)
    names = ", ".join(f"{f} ({d.format}, {d.num_samples:,} samples)" for f, d in outs)
    if rest and sum(e.size for e in rest) > inside:
        found = _detect_entries(store, root, rest, walk)
        found.others["dsconvert"] = len(outs)
        found.description += f"; also {len(outs):,} dsconvert output{'s' if len(outs) != 1 else ''}: {names}"
        return found
    formats = {d.format for _, d in outs}
    n = len(outs)
    found = Detected(
        root, "dsconvert", f"{n:,} dsconvert output{'s' if n != 1 else ''} in subfolders: {names}",
        files=[f for _, d in outs for f in d.files], num_samples=sum(d.num_samples or 0 for _, d in outs),
        reader=READERS["dsconvert"], format=formats.pop() if len(formats) == 1 else None,
        advice=outs[0][1].advice, damaged=[f"{f}/{x}" for f, d in outs for x in d.damaged],
        complete=walk.complete, details={"outputs": {f: d.to_dict() for f, d in outs}})
    if rest:
        kinds = Counter(plain_kind(k) for k in _classify_all(store, rest)[0].values())
        found.others = dict(kinds)
        found.description += ("; also " + ", ".join(count_files(c, k) for k, c in sorted(kinds.items()))
                              + f" ({name_list(rest)})")
    return found


def _dsconvert(store: Store, root: str, walk: Walk) -> Detected:
    mpath = store.join(root, MANIFEST_NAME)
    entry = next(e for e in walk.entries if e.rel == MANIFEST_NAME)
    try:
        if entry.size > limits.MAX_MANIFEST:
            raise ValueError(f"{entry.size:,} bytes, more than a manifest holds")
        with store.open(mpath) as f:
            m = Manifest.from_dict(json.loads(f.read(limits.MAX_MANIFEST + 1)), where=mpath)
    except Exception as exc:  # ManifestError, JSON errors, RecursionError...
        found = _detect_entries(store, root, [e for e in walk.entries if e.rel != MANIFEST_NAME], walk)
        found.description = (f"{found.description}; beside a {MANIFEST_NAME} that is not a valid manifest "
                             f"({short_error(exc)})")
        found.damaged.append(f"{MANIFEST_NAME}: {short_error(exc)}")
        return found
    names = {e.rel for e in walk.entries}
    own = set(m.own_files())
    for s in m.shards:
        own.add(s.name)
        own.update(p for p in [s.index, *s.parts] if p)
    shard_files = [store.join(root, s.name) for s in m.shards]
    missing = [s.name for s in m.shards if s.name not in names]
    stray = [e for e in walk.entries if e.rel not in own]
    fmt = m.format
    parts = [f"a dsconvert {fmt} output: {m.num_samples:,} samples in {len(m.shards):,} "
             f"shard{'s' if len(m.shards) != 1 else ''}", _stored(m)]
    if missing:
        parts.append(f"{len(missing):,} shard{'s' if len(missing) != 1 else ''} listed in the manifest "
                     f"missing ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})")
    others: Dict[str, int] = {}
    if stray:
        kinds = Counter(plain_kind(k) for k in _classify_all(store, stray)[0].values())
        others = dict(kinds)
        parts.append(f"also {len(stray):,} file{'s' if len(stray) != 1 else ''} not in the manifest ("
                     + ", ".join(count_files(n, k) for k, n in sorted(kinds.items()))
                     + f": {name_list(stray)})")
    return Detected(
        root, "dsconvert", ", ".join(p for p in parts if p), files=shard_files, num_samples=m.num_samples,
        reader=READERS["dsconvert"], convertible=False, format=fmt, others=others,
        damaged=[f"{n}: missing" for n in missing], complete=walk.complete,
        advice=("already converted: read it with dsconvert.open_dataset(path) (`dsconvert verify` checks it); "
                "converting it again would not make reading faster"),
        details={"fields": m.fields, "classes": len(m.classes) if m.classes is not None else None,
                 "stored": m.stored, "options": {k: m.options.get(k) for k in ("size", "resize", "decode")}},
    )


def _stored(m: Manifest) -> str:
    classes = f", {len(m.classes):,} classes" if m.classes else ""
    if m.stored == "decoded":
        size, resize = m.options.get("size"), m.options.get("resize")
        if size:
            geometry = f"{size[0]}x{size[1]} uint8 RGB"
        elif resize:
            geometry = f"uint8 RGB, short side {resize}"
        else:
            geometry = "uint8 RGB at the source's sizes"
        return geometry + classes
    fields = "+".join(sorted(m.fields)) or "no fields"
    return f"encoded {fields}{classes}"


def _classify_all(store: Store, entries: Sequence[Entry]) -> Tuple[Dict[str, str], Dict[str, Sniff]]:
    """kind of every entry: the files sniffed (up to limits.SNIFF_PER_GROUP per extension, limits.MAX_SNIFF in
    all, spread over each group) by content, the rest as the majority of their extension."""
    groups: Dict[str, List[Entry]] = {}
    for e in entries:
        groups.setdefault(e.ext, []).append(e)
    sniffs: Dict[str, Sniff] = {}
    budget = limits.MAX_SNIFF
    for ext in sorted(groups, key=lambda x: -len(groups[x])):
        group = groups[ext]
        if ext in ("mdb",):
            pick = group  # LMDB's two files are read together
        elif is_image_field(ext) and len(group) > 2:
            pick = [group[0], group[-1]]  # images are taken by name, as the scanner takes them
        else:
            n = min(len(group), limits.SNIFF_PER_GROUP, max(0, budget))
            pick = [group[i * len(group) // n] for i in range(n)]
        for e in pick:
            sniffs[e.rel] = sniff(store, e)
        budget -= len(pick)
    kinds: Dict[str, str] = {}
    for group in groups.values():
        seen = Counter(sniffs[e.rel].kind for e in group if e.rel in sniffs)
        majority = seen.most_common(1)[0][0] if seen else None
        for e in group:  # past the budget, a file is what its name says
            kinds[e.rel] = sniffs[e.rel].kind if e.rel in sniffs else majority or hint_of(e) or "other"
    return kinds, sniffs


def _detect_entries(store: Store, root: str, entries: List[Entry], walk: Walk,
                    single: bool = False) -> Detected:
    if not entries:
        why = "an empty folder" if not walk.unreadable else f"an unreadable folder ({walk.unreadable[0]})"
        if walk.outside_links:
            why += f" (symlinks out of the tree not followed: {', '.join(walk.outside_links[:3])})"
        return Detected(root, "unknown", why, complete=walk.complete)
    kinds, sniffs = _classify_all(store, entries)
    weight: Counter = Counter()
    count: Counter = Counter()
    for e in entries:
        k = kinds[e.rel] = plain_kind(kinds[e.rel])
        weight[k] += max(1, e.size)
        count[k] += 1
    dominant = weight.most_common(1)[0][0]
    mine = [e for e in entries if kinds[e.rel] == dominant]
    others = {k: n for k, n in count.items() if k != dominant}
    damaged = [f"{e.rel}: {sniffs[e.rel].damaged}" for e in entries if e.rel in sniffs and sniffs[e.rel].damaged]
    found = describe(store, root, dominant, mine, sniffs, walk, single)
    found.others = others
    found.damaged = damaged + found.damaged
    found.complete = walk.complete
    extra = []
    if others:
        extra.append("also " + ", ".join(count_files(n, k) for k, n in sorted(others.items())))
    rels = {e.rel for e in mine}
    bad = sorted({d.split(": ", 1)[0] for d in found.damaged if d.split(": ", 1)[0] in rels})
    if bad and "damaged" not in found.description:
        first = next(d for d in found.damaged if d.split(": ", 1)[0] in rels)
        read = sum(1 for e in mine if e.rel in sniffs)
        extra.append(f"{len(bad):,} of the {read:,} files read {'is' if len(bad) == 1 else 'are'} damaged "
                     f"({first}{'; ...' if len(bad) > 1 else ''})")
    if not walk.complete:
        extra.append(f"the listing stops at {limits.MAX_ENTRIES:,} entries (a cap): the counts before are of the "
                     f"first {limits.MAX_ENTRIES:,} entries, not of the whole folder")
    if walk.outside_links:
        extra.append(f"{len(walk.outside_links):,} symlinks out of the tree not followed")
    if extra:
        found.description += "; " + "; ".join(extra)
    return found
