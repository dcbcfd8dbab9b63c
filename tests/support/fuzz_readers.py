"""Coverage-guided fuzzing (atheris) of what dsconvert reads from disk: the manifest parser and
the wds shard index reader, fed real documents with nodes replaced or deleted as the fuzzer's
bytes choose (structure-aware: random bytes are rarely JSON). Anything but ManifestError is a
crash.
The test suite runs a derandomized hypothesis version of the same harnesses
(tests/test_properties.py); this is for long runs.

    pip install atheris
    python -m tests.support.fuzz_readers manifest -atheris_runs=200000   # from the repository root
    python -m tests.support.fuzz_readers record -max_total_time=600
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import atheris

with atheris.instrument_imports():
    from dsconvert import Manifest, ManifestError
    from dsconvert.formats.wds import Wds, WdsShard
    from dsconvert.io.shard_cache import ShardAccess


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0):
    kind = fdp.ConsumeIntInRange(0, 7 if depth < 3 else 4)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeIntInRange(-2**40, 2**40) if fdp.ConsumeBool() else fdp.ConsumeIntInRange(-2, 64)
    if kind == 3:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 12))
    if kind == 4:
        return fdp.ConsumeFloat()
    if kind == 5:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {fdp.ConsumeUnicodeNoSurrogates(6): _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))}


def mutate(fdp: atheris.FuzzedDataProvider, doc):
    """Replace (or delete) nodes of a real document, chosen by the fuzzer's bytes."""
    doc = json.loads(json.dumps(doc))
    for _ in range(fdp.ConsumeIntInRange(1, 3)):
        node, key, cur = None, None, doc
        while isinstance(cur, (dict, list)) and cur and (node is None or fdp.ConsumeBool()):
            keys = list(cur) if isinstance(cur, dict) else list(range(len(cur)))
            node, key = cur, keys[fdp.ConsumeIntInRange(0, len(keys) - 1)]
            cur = cur[key]
        if node is None:
            return _value(fdp)
        if isinstance(node, dict) and fdp.ConsumeBool():
            del node[key]
        else:
            node[key] = _value(fdp)
    return doc


def make_output() -> tuple:
    """A real one-shard output whose manifest and index the fuzzer mutates."""
    from PIL import Image

    from dsconvert import convert

    tmp = tempfile.mkdtemp(prefix="dsconvert-fuzz-")
    for i in range(4):
        os.makedirs(os.path.join(tmp, "src", f"c{i % 2}"), exist_ok=True)
        Image.new("RGB", (8, 6), (i * 40, 10, 200)).save(os.path.join(tmp, "src", f"c{i % 2}", f"{i}.jpg"))
    out = os.path.join(tmp, "out")
    return out, convert(os.path.join(tmp, "src"), out, workers=1).manifest


def manifest_harness():
    out, _ = make_output()
    doc = json.load(open(os.path.join(out, "dsconvert.json")))

    def fuzz(blob: bytes) -> None:
        try:
            m = Manifest.from_dict(mutate(atheris.FuzzedDataProvider(blob), doc))
        except ManifestError:
            return
        assert m.num_samples == sum(s.num_samples for s in m.shards)
        assert all("/" not in s.name and s.name not in (".", "..") for s in m.shards)

    return fuzz


def record_harness():
    out, manifest = make_output()
    entry = manifest.shards[0]
    index = os.path.join(out, entry.index)
    doc = json.load(open(index))

    def fuzz(blob: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(blob)
        with open(index, "w") as f:
            json.dump(mutate(fdp, doc), f)
        try:
            Wds.load_record(index)
            shard = WdsShard(ShardAccess(out), entry, 1 << 20)
        except ManifestError:
            return
        shard.prepare(0, len(shard.keys), prefetch=fdp.ConsumeBool())
        try:
            for i in range(len(shard.index.keys)):
                for data in shard.fields(i).values():
                    assert len(data) <= shard.size
            for _, data in shard.images(0, len(shard.index.keys)):
                assert len(data) <= shard.size
        except ManifestError:
            pass
        finally:
            shard.close()

    return fuzz


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in ("manifest", "record"):
        sys.exit(__doc__)
    target = manifest_harness() if sys.argv[1] == "manifest" else record_harness()
    atheris.Setup([sys.argv[0]] + sys.argv[2:], target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
