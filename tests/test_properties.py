"""Properties, and fuzzing of what is read from disk.

* every sample exactly once across ranks and DataLoader workers, balanced, through the real
  reader and a real DataLoader's worker processes (and the pad/drop contracts);
* manifests round-trip through save and load;
* fuzz: the manifest parser, the shard-record parser and the tar index reader, given mutated
  documents, either accept them or raise ManifestError, never anything else, and an accepted
  index never makes the reader fail any other way.

Key encoding round trips and shard planning have their own property tests (test_keys.py,
test_shards.py). Fuzz runs are derandomized, so CI sees the same cases every time.
"""

import copy
import dataclasses
import hashlib
import json
import os
import tarfile
import tempfile
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dsconvert import Manifest, ManifestError, convert, open_dataset
from dsconvert.distributed import rank_span, split_range
from dsconvert.manifest import ShardEntry

from conftest import examples, make_image_folder
from support.records import read_record, write_record

FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=examples(300),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# --- the rank / worker split ------------------------------------------------------------------


@given(st.integers(0, 400), st.integers(1, 9), st.integers(1, 6), st.sampled_from([None, "pad", "drop"]))
def test_split_is_exact_and_balanced(n, world, workers, even):
    per_rank = []
    for rank in range(world):
        start, stop = rank_span(n, rank, world, even)
        blocks = [split_range(stop - start, workers, w) for w in range(workers)]
        assert max(b - a for a, b in blocks) - min(b - a for a, b in blocks) <= 1  # workers balanced
        per_rank.append([start + i for a, b in blocks for i in range(a, b)])
    lengths = [len(p) for p in per_rank]
    everything = [p for positions in per_rank for p in positions]
    if even is None:
        assert everything == list(range(n))  # exactly once, in order
        assert max(lengths) - min(lengths) <= 1
    elif even == "drop":
        assert lengths == [n // world] * world and len(set(everything)) == len(everything)
        assert all(p < n for p in everything)
    else:
        assert lengths == [-(-n // world) if n else 0] * world
        if n:
            seen = Counter(p % n for p in everything)  # every sample, repeats spread evenly
            assert set(seen) == set(range(n)) and max(seen.values()) - min(seen.values()) <= 1
            assert len(everything) - n < world  # fewer than one per rank added


@pytest.fixture(scope="module")
def uneven(tmp_path_factory, photos):
    tmp = tmp_path_factory.mktemp("uneven")
    src = str(tmp / "src")
    make_image_folder(src, photos, {"a": 11, "b": 7, "c": 5}, size=(16, 12))
    out = str(tmp / "out")
    convert(src, out, samples_per_shard=4, workers=1)  # 23 samples in 6 uneven shards
    return out


class Sha1:
    """The transform that names a sample by its bytes (picklable for DataLoader workers)."""

    def __call__(self, raw):
        return hashlib.sha1(raw).hexdigest()


@pytest.fixture(scope="module")
def uneven_samples(uneven):
    """(sha1 of the image, label) of each of the 23 samples, all distinct: a sample read twice
    or never shows in a multiset of them."""
    samples = sorted(open_dataset(uneven, decode="raw", transform=Sha1()))
    assert len(samples) == 23 and len(set(samples)) == 23
    return samples


@settings(deadline=None, max_examples=examples(60), derandomize=True, database=None)
@given(world=st.integers(1, 7), shuffle=st.booleans(), seed=st.integers(0, 3), epoch=st.integers(0, 3))
def test_real_reader_reads_each_sample_once_across_ranks(uneven, uneven_samples, world, shuffle, seed, epoch):
    """Ranks, shuffles and epochs over the real reader, in this process (one worker); the
    split among workers is the DataLoader test's below, and split_range's property above."""
    got = []
    for rank in range(world):
        ds = open_dataset(uneven, decode="raw", rank=rank, world_size=world, shuffle=shuffle, seed=seed, even=None,
                          buffer_size=5, transform=Sha1())
        ds.set_epoch(epoch)
        items = list(ds)
        assert len(items) == len(ds)  # len() is exact for the rank
        got += items
    assert sorted(got) == uneven_samples


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # more workers than cores, on purpose
@pytest.mark.parametrize("world, workers, shuffle, seed, epoch", [
    (1, 3, False, 0, 0),
    (2, 2, True, 1, 2),
    (3, 4, True, 3, 1),  # 7 or 8 samples a rank, in 6 uneven shards
    (7, 4, False, 2, 0),  # 3 or 4 samples a rank: some workers get none
])
def test_real_dataloader_reads_each_sample_once_across_ranks_and_workers(uneven, uneven_samples, torch, world,
                                                                         workers, shuffle, seed, epoch):
    """A real DataLoader's worker processes split each rank's samples among themselves."""
    got = []
    for rank in range(world):
        ds = open_dataset(uneven, decode="raw", rank=rank, world_size=world, shuffle=shuffle, seed=seed, even=None,
                          buffer_size=5, transform=Sha1())
        ds.set_epoch(epoch)
        items = [(digest, int(label)) for digest, label in
                 torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers)]
        assert len(items) == len(ds)  # len() is exact for the rank
        got += items
    assert sorted(got) == uneven_samples


# --- manifests --------------------------------------------------------------------------------

names = st.from_regex(r"[a-z][a-z0-9_-]{0,8}-[0-9]{6}\.(tar|h5|npy)", fullmatch=True)  # as dsconvert names them
texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def manifests(draw):
    shards = draw(st.lists(st.builds(ShardEntry, names, st.integers(0, 10**6), st.integers(0, 10**12),
                                     st.text("0123456789abcdef", min_size=64, max_size=64),
                                     st.one_of(st.none(), names.map(lambda n: n + ".index.json"))),
                           max_size=5))
    classes = draw(st.one_of(st.none(), st.lists(texts, max_size=5)))
    return Manifest(format=draw(st.sampled_from(["wds", "hdf5", "npy"])),
                    source={"url": draw(texts), "layout": draw(st.sampled_from(["imagefolder", "flat", "list"]))},
                    sample_type=draw(st.sampled_from(["classification", "dict"])), classes=classes,
                    fields=draw(st.dictionaries(texts, texts, max_size=3)),
                    num_samples=sum(s.num_samples for s in shards), shards=shards,
                    skipped=draw(st.lists(st.fixed_dictionaries({"path": texts, "reason": texts}), max_size=3)),
                    stored=draw(st.sampled_from(["encoded", "decoded"])))


@settings(deadline=None, database=None)
@given(manifests())
def test_manifest_round_trip(m):
    with tempfile.TemporaryDirectory() as tmp:
        m.save(tmp)
        assert Manifest.load(tmp) == m


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def mutate(data, doc):
    """Replace one node anywhere in ``doc`` with arbitrary JSON, or delete a key."""
    doc = copy.deepcopy(doc)
    node, key = None, None
    cur = doc
    while True:
        children = list(cur.keys()) if isinstance(cur, dict) else list(range(len(cur))) if isinstance(cur, list) else []
        if not children or (node is not None and data.draw(st.booleans())):
            break
        node, key = cur, data.draw(st.sampled_from(children))
        cur = cur[key]
    if node is None:
        return data.draw(json_values)
    if isinstance(node, dict) and data.draw(st.booleans()):
        del node[key]
    else:
        node[key] = data.draw(json_values)
    return doc


@pytest.fixture(scope="module")
def real_output(tmp_path_factory, photos):
    tmp = tmp_path_factory.mktemp("fuzz")
    src = str(tmp / "src")
    make_image_folder(src, photos, {"a": 3, "b": 2}, size=(16, 12))
    out = str(tmp / "out")
    convert(src, out, samples_per_shard=10, workers=1)
    return out


@FUZZ
@given(data=st.data())
def test_fuzz_manifest_parser(real_output, data):
    doc = json.load(open(os.path.join(real_output, "dsconvert.json")))
    try:
        m = Manifest.from_dict(mutate(data, doc))
    except ManifestError:
        return
    assert m.num_samples == sum(s.num_samples for s in m.shards)
    assert all("/" not in s.name and s.name not in (".", "..") for s in m.shards)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_manifest_bytes(blob):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "dsconvert.json"), "wb") as f:
            f.write(blob)
        with pytest.raises(ManifestError):
            Manifest.load(tmp)


def _binary_damage(data, blob):
    """``blob`` (a binary record) with bytes flipped, cut short, or its JSON header mutated."""
    how = data.draw(st.sampled_from(["flip", "truncate", "header"]))
    if how == "flip":
        out = bytearray(blob)
        for _ in range(data.draw(st.integers(1, 4))):
            at = data.draw(st.integers(0, len(out) - 1))
            out[at] ^= data.draw(st.integers(1, 255))
        return bytes(out)
    if how == "truncate":
        return blob[: data.draw(st.integers(0, len(blob) - 1))]
    h = int.from_bytes(blob[8:16], "little")
    header = json.dumps(mutate(data, json.loads(blob[16:16 + h]))).encode()
    header += b" " * (-(16 + len(header)) % 8)  # the columns' offsets count from the header's end
    return blob[:8] + len(header).to_bytes(8, "little") + header + blob[16 + h:]


@FUZZ
@given(data=st.data())
@pytest.mark.parametrize("form", ["json", "binary-fields", "binary-bytes"])
def test_fuzz_record_parser_and_tar_index_reader(real_output, form, data):
    """A mutated shard record (an older output's JSON, a binary one rewritten from a mutated
    dict, or a binary one with its bytes or header damaged) is refused with ManifestError, or
    read without any other error: every member read is the member of the original shard that
    the record names (its own tar header checked), never other bytes."""
    from dsconvert.formats.wds import Wds, WdsShard
    from dsconvert.io.shard_cache import ShardAccess

    manifest = Manifest.load(real_output)
    # without the manifest's digest of the record (as older manifests): the record's own checks are fuzzed
    entry = dataclasses.replace(manifest.shards[0], parts={})
    path = os.path.join(real_output, entry.index)
    with tarfile.open(os.path.join(real_output, entry.name)) as tf:
        members = {m.name: tf.extractfile(m).read() for m in tf}
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.join(real_output, entry.name), os.path.join(tmp, entry.name))
        if form == "binary-bytes":
            damaged = _binary_damage(data, open(path, "rb").read())
            open(os.path.join(tmp, entry.index), "wb").write(damaged)
        elif form == "json":  # an older output's record, under the name the manifest gives it
            json.dump(mutate(data, read_record(path)), open(os.path.join(tmp, entry.index), "w"))
        else:
            write_record(os.path.join(tmp, entry.index), mutate(data, read_record(path)))
        try:
            Wds.load_record(os.path.join(tmp, entry.index))
        except ManifestError:
            pass
        try:
            shard = WdsShard(ShardAccess(tmp), entry, 1 << 20)
        except ManifestError:
            return
        shard.prepare(0, len(shard.keys), prefetch=data.draw(st.booleans()))
        try:
            for i in range(len(shard.keys)):
                for field, blob in shard.fields(i).items():
                    assert bytes(blob) == members[f"{shard.keys[i]}.{field}"]
            for i, blob in shard.images(0, len(shard.keys)):
                assert bytes(blob) in [v for k, v in members.items() if k.startswith(shard.keys[i] + ".")]
        except ManifestError:
            pass  # e.g. a sample left without an image member
        finally:
            shard.close()


def test_fuzz_cases_include_valid_documents(real_output):
    """The unmutated documents parse: the fuzz tests above start from real ones."""
    from dsconvert.formats.wds import Wds

    m = Manifest.load(real_output)
    assert Wds.load_record(os.path.join(real_output, m.shards[0].index)).d["num_samples"] == 5
    json.load(open(os.path.join(real_output, "dsconvert.json")))
