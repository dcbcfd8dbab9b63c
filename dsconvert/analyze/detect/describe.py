"""The description text, the sample count and the advice for the dominant kind of a path's
files, from their sniffs and what :mod:`.details` reads further."""

from __future__ import annotations

import posixpath
from collections import Counter
from typing import Any, Dict, List, Tuple

from ...optional import optional_import
from ...source.folders import LIST_SUFFIXES, looks_like_image_folder
from . import limits
from .details import arrow_meta, h5_summary, parquet_meta, tar_keys, tfrecord_first
from .kinds import FILE_LABELS, READERS, Detected, count_files, product, shape_text, short_error
from .sniffers import Sniff
from .walk import Entry, Store, Walk

__all__ = ["describe"]


def describe(store: Store, root: str, kind: str, mine: List[Entry], sniffs: Dict[str, Sniff], walk: Walk,
              single: bool) -> Detected:
    files = [e.path for e in mine]
    n = len(mine)
    nfiles = f"{n:,} file{'s' if n != 1 else ''}"
    read = [sniffs[e.rel] for e in mine if e.rel in sniffs]
    good = [(e, sniffs[e.rel]) for e in mine if e.rel in sniffs and not sniffs[e.rel].damaged]
    d = Detected(root, kind, "", files=files, reader=READERS[kind])
    if good == [] and read and kind not in ("files", "unknown"):
        d.description = (f"a damaged {FILE_LABELS[kind]} file: {read[0].damaged}" if n == 1 else
                         f"{count_files(n, kind)}, damaged ({read[0].damaged})")
        d.advice = "the files are damaged: regenerate or re-download them"
        return d
    if kind == "npy":
        _describe_npy(d, mine, good, nfiles, single)
    elif kind == "npz":
        arrays = good[0][1].info.get("arrays", {}) if good else {}
        listing = ", ".join(f"{k} {shape_text(v['shape'])} {v['dtype']}" for k, v in list(arrays.items())[:4])
        d.description = f"{'an .npz archive' if single else f'.npz archives: {nfiles}'}" + (
            f": arrays {listing}" if listing else "")
        firsts = {v["shape"][0] for v in arrays.values() if v["shape"]}
        if single and len(firsts) == 1:
            d.num_samples = firsts.pop()
        d.advice = ("np.load on an .npz reads (and for savez_compressed inflates) a whole array on each access and "
                    "cannot memory-map it: store the arrays with np.save and read them with np.load(mmap_mode='r')")
    elif kind == "hdf5":
        _describe_hdf5(store, d, mine, good, nfiles, single)
    elif kind == "webdataset":
        _describe_tar(store, d, mine, good, n)
    elif kind == "parquet":
        _describe_table(store, d, mine, good, nfiles, "Parquet", parquet_meta)
        d.advice = ("columnar row groups: read with pyarrow.parquet (iter_batches) or "
                    "datasets.load_dataset('parquet'); random access decodes a whole row group, so keep row groups "
                    "small for shuffled reads; dsconvert shard takes Parquet with an image column as a source "
                    "(--label names the label column)")
    elif kind == "arrow":
        ipc = {e.path: s.info.get("ipc", "file") for e, s in good}
        _describe_table(store, d, mine, good, nfiles, "Arrow IPC", lambda st, p: arrow_meta(st, p, ipc[p]))
        d.advice = ("memory-mappable: datasets.Dataset.from_file / pyarrow.memory_map read it without copying; "
                    "conversion would not make reading faster")
        names = {e.name for e in walk.entries if "/" not in e.rel}
        if {"state.json", "dataset_info.json"} <= names:
            d.description = "a Hugging Face datasets folder (save_to_disk): " + d.description
            d.reader = "datasets.load_from_disk"
    elif kind == "lmdb":
        data = [(e, s) for e, s in good if e.name == "data.mdb"]
        entries = [s.info.get("entries") for _, s in data]
        counts = [x for x in entries if isinstance(x, int)]
        envs = len(data)
        if envs and len(counts) == len(entries):
            d.num_samples = sum(counts)
        d.files = [e.path for e, _ in data] or files
        has_lock = any(e.name == "lock.mdb" for e in mine)
        d.description = (f"LMDB: {envs or 'no'} environment{'s' if envs != 1 else ''} (data.mdb"
                         f"{' + lock.mdb' if has_lock else ', no lock.mdb'}, meta-page magic checked)"
                         + (f", {d.num_samples:,} entries in the main database" if d.num_samples is not None else ""))
        d.advice = ("key-value pages read by mmap: open the environment in each DataLoader worker (readonly=True, "
                    "lock=False); random reads are fast while the data fits the page cache")
    elif kind == "tfrecord":
        bad = ""
        if good:
            bad = tfrecord_first(store, good[0][0].path, good[0][1].info.get("first_record", 0))
        d.description = f"TFRecord: {nfiles} (first record's length CRC checked" + (
            f"; {good[0][0].rel}: {bad})" if bad else ")")
        if bad:
            d.damaged.append(f"{good[0][0].rel}: {bad}")
        d.advice = ("sequential record files: read with tf.data.TFRecordDataset or the tfrecord package (with an index "
                    "for random access); dsconvert cannot take them as a source")
    elif kind == "pickle":
        torch = any(s.info.get("torch_zip") for _, s in good)
        d.description = (f"{'a pickle' if single else f'pickles: {nfiles}'}"
                         + (" (torch.save zip archives)" if torch else "") + "; not unpickled (it runs code)")
        d.advice = ("pickled samples run code when loaded and are slow to unpickle: store arrays with np.save/np.savez "
                    "(or convert the original files with dsconvert shard)")
    elif kind == "files":
        _describe_files(store, root, d, mine, walk, single)
    else:
        d.description = f"{'a file' if single else nfiles} of no format recognised here"
    return d


def _describe_npy(d: Detected, mine: List[Entry], good: List[Tuple[Entry, Sniff]], nfiles: str,
                  single: bool) -> None:
    infos = [s.info for _, s in good]
    objects = any(i.get("object") for i in infos)
    if single and infos:
        i = infos[0]
        d.description = f"an .npy array: {shape_text(i['shape'])} {i['dtype']}"
        d.num_samples = i["shape"][0] if i["shape"] else None
    else:
        shapes = Counter((i["shape"], i["dtype"]) for i in infos)
        if len(shapes) == 1:
            (shape, dtype), = shapes
            d.description = f"a folder of .npy arrays: {nfiles}, each {shape_text(shape)} {dtype}"
            if len(good) == len(mine):  # one sample per file, every file read
                d.num_samples = len(mine)
            else:
                d.estimated_samples = len(mine)
        else:
            firsts = {i["shape"][0] for i in infos if i["shape"]}
            listing = ", ".join(f"{e.name} {shape_text(s.info['shape'])} {s.info['dtype']}" for e, s in good[:4])
            d.description = f"a folder of .npy arrays: {nfiles} ({listing}{', ...' if len(good) > 4 else ''})"
            if len(firsts) == 1 and len(good) == len(mine):  # X (N, ...) and y (N,): N samples
                d.num_samples = firsts.pop()
    if any("'offset'" in i["dtype"] and "'height'" in i["dtype"] for i in infos):
        d.description += ("; the samples tables of dsconvert npy shards, without their manifest "
                          "(an unfinished conversion or copied shards)")
    if objects:
        d.description += "; holds pickled Python objects (dtype object)"
        d.advice = ("object arrays are pickles (loading them runs code and is slow): store numeric arrays "
                    "with np.save, read with np.load(mmap_mode='r')")
    else:
        d.advice = ("already decoded arrays: read with np.load(mmap_mode='r') in the workers; conversion would not "
                    "make reading faster")


def _read_details(store: Store, d: Detected, good: List[Tuple[Entry, Sniff]], read: Any) -> List[Dict[str, Any]]:
    """What ``read(store, path)`` -> (details, why not) gives for the first few good files; a
    file it cannot read is noted as damaged."""
    found = []
    for e, _ in good[:limits.MAX_DETAIL]:
        details, why = read(store, e.path)
        if why:
            d.damaged.append(f"{e.rel}: {why}")
        elif details:
            found.append(details)
    return found


def _describe_hdf5(store: Store, d: Detected, mine: List[Entry], good: List[Tuple[Entry, Sniff]],
                   nfiles: str, single: bool) -> None:
    summaries = _read_details(store, d, good, h5_summary)
    head = "an HDF5 file" if single else f"HDF5: {nfiles}"
    if not summaries:
        d.description = head + (f", damaged ({d.damaged[0].split(': ', 1)[1]})" if d.damaged else "")
        d.advice = "h5py cannot open it: regenerate or re-download it" if d.damaged else ""
        return
    sets = summaries[0]["datasets"]
    main = sorted(sets, key=lambda s: -product(s["shape"]))
    text = []
    for s in main[:3]:
        chunked = f" chunked {shape_text(s['chunks'])}" if s["chunks"] else " contiguous"
        comp = f", {s['compression']}" if s["compression"] else ""
        text.append(f"'{s['name']}' {shape_text(s['shape'])} {s['dtype']}{chunked}{comp}")
    more = f" (+{len(sets) - 3} more)" if len(sets) > 3 else ""
    noun = "dataset" if len(sets) == 1 else "datasets"
    d.description = f"{head}: {noun} {', '.join(text) or 'none'}{more}" + ("" if single else " (first file)")
    firsts = [{s["shape"][0] for s in sm["datasets"] if s["shape"]} for sm in summaries]
    if all(len(f) == 1 for f in firsts) and firsts:
        total = sum(f.pop() for f in firsts)
        if len(summaries) == len(mine):
            d.num_samples = total
        else:
            d.estimated_samples = total * len(mine) // len(summaries)
    if summaries[0]["attrs"].get("dsconvert_format"):
        d.description += "; written by dsconvert, without its manifest (an unfinished conversion or a copied shard)"
    notes = []
    big = main[0] if main else None
    if big and big["chunks"] and big["shape"] and big["chunks"][0] > 1:
        notes.append(f"a random read of one sample reads a whole chunk of {big['chunks'][0]}")
    if big and big["compression"] == "gzip":
        notes.append("gzip chunks cost CPU on every read (lzf or none reads faster)")
    d.advice = ("read with h5py, opening the file in each DataLoader worker (not before the fork)"
                + (f"; {'; '.join(notes)}" if notes else ""))


def _describe_tar(store: Store, d: Detected, mine: List[Entry], good: List[Tuple[Entry, Sniff]], n: int) -> None:
    counted = []
    fields: Counter = Counter()
    exact = True
    split = 0  # keys met again after another key: webdataset yields each run as its own sample
    for e, s in good[:limits.MAX_DETAIL]:
        keys, why = tar_keys(store, e.path, bool(s.info.get("gzip")))
        if why:
            d.damaged.append(f"{e.rel}: {why}")
            exact = False
        if not keys["complete"]:
            exact = False
        share = keys["fraction"] if keys["fraction"] > 0 else 1.0
        counted.append(keys["samples"] / share if not keys["complete"] and not why else keys["samples"])
        fields.update(keys["fields"])
        split += keys["split"]
    gz = sum(1 for _, s in good if s.info.get("gzip"))
    what = "tar.gz" if gz == len(good) and gz else "tar"
    desc = f"WebDataset shards: {n:,} {what} file{'s' if n != 1 else ''}"
    if counted:
        total = sum(counted) * n / len(counted)
        if exact and len(counted) == n:
            d.num_samples = int(total)
            desc += f", {int(total):,} samples"
        else:
            d.estimated_samples = int(round(total))
            desc += f", ~{int(round(total)):,} samples"
        kinds = "+".join(f for f, _ in fields.most_common(6) if f) or "no fields"
        desc += f" of {kinds} (keys from tar headers)"
        if split:
            desc += (f"; {split:,} keys recur after other keys' members, and webdataset yields each run as a "
                     "separate sample (write members sorted by key)")
    d.description = desc
    d.advice = ("already sharded for sequential reads: read them in place with open_dataset(FOLDER) (indexed by their "
                "headers on first open; label='cls' for (image, label) samples) or webdataset.WebDataset; dsconvert "
                "shard takes them as a source (--label names the class field)" if not gz else
                "compressed tars: open_dataset(FOLDER) reads them in place through their decompressed streams (best "
                "in order, stream=True: a random read inflates up to 8 MiB first), and dsconvert shard converts them "
                "into plain tars read by index (--label names the class field)")


def _describe_table(store: Store, d: Detected, mine: List[Entry], good: List[Tuple[Entry, Sniff]],
                    nfiles: str, name: str, meta_of: Any) -> None:
    unavailable = optional_import("pyarrow") is None
    metas = _read_details(store, d, good, meta_of)
    desc = f"{name}: {nfiles}"
    if metas:
        rows = [m.get("rows") for m in metas]
        counts = [r for r in rows if isinstance(r, int)]
        if len(counts) == len(rows):
            if len(metas) == len(mine):
                d.num_samples = sum(counts)
                desc += f", {d.num_samples:,} rows"
            else:
                d.estimated_samples = sum(counts) * len(mine) // len(metas)
                desc += f", ~{d.estimated_samples:,} rows"
        else:
            desc += ", rows unknown from the header"
        desc += f", columns {', '.join(metas[0]['columns'][:8])}"
    elif unavailable:
        desc += ", rows unknown (pyarrow is not installed to read the footer)"
    d.description = desc


def _describe_files(store: Store, root: str, d: Detected, mine: List[Entry], walk: Walk, single: bool) -> None:
    from ...source import scan

    exts = Counter(e.ext or "(none)" for e in mine)
    kinds = ", ".join(f"{n:,} {x}" for x, n in exts.most_common(4)) + (", ..." if len(exts) > 4 else "")
    n = len(mine)
    layout = None
    if not single and walk.listings:
        layout = "imagefolder" if looks_like_image_folder(walk.listings[:256]) else "flat"
    if single and mine[0].name.lower().endswith(LIST_SUFFIXES):
        layout = "list"
    d.convertible = layout is not None
    scanned = None
    refused = ""
    if store.fs is None and walk.complete and (layout in ("imagefolder", "flat") and n <= limits.SCAN_FILES
                                               or layout == "list" and mine[0].size <= 8 << 20):
        try:
            scanned = scan(root)
        except Exception as exc:  # SourceError "no samples found", an unreadable list...
            d.convertible = False
            refused = f"dsconvert's scanner refuses it ({short_error(exc)})"
            d.damaged.append(f"{posixpath.basename(root)}: {refused}")
    if scanned is not None:
        d.num_samples = len(scanned.samples)
        layout = scanned.layout
    if layout == "list":
        d.description = "a list of files (" + mine[0].name + ")" + (
            f": {d.num_samples:,} samples" if d.num_samples is not None else "")
    elif layout is None:
        d.description = f"a file ({mine[0].ext or 'no extension'}) of no dataset format recognised here"
        d.kind = "unknown"
        d.reader = ""
    else:
        classes = f", {len(scanned.classes):,} classes" if scanned is not None and scanned.classes else ""
        samples = f", {d.num_samples:,} samples" if d.num_samples is not None else ""
        d.description = (f"{'an ImageFolder tree' if layout == 'imagefolder' else 'a flat folder of files'}: "
                         f"{n:,} files ({kinds}){samples}{classes}")
    if refused:
        d.description += f"; {refused}"
    if d.kind == "files":
        d.advice = ("loose files: each sample costs an open and a read; `dsconvert analyze` measures whether that "
                    "limits loading, and `dsconvert shard` converts it")
