"""Every file of every output format, mutated, through every reader entry point.

One file of a real output (a shard, its index, a samples table, the manifest) is damaged:
bytes flipped, cut, extended, overwritten, or a JSON node replaced; half the time the
manifest is then made to agree with it (a consistent hostile output, as a download could
be). ``open_dataset`` reads every sample and ``verify --decode`` checks it all. The
promises: nothing but a dsconvert error reaches the caller (a ``ManifestError`` about the
output, a ``BadInputError`` about a sample); no file appears outside the output; no
allocation is larger than the files justify.
"""

import hashlib
import json
import os
import shutil
import tempfile
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from dsconvert import DsconvertError, ManifestError, convert, open_dataset
from dsconvert.verify import verify

from conftest import examples, make_image_folder, rehash_parts
from test_properties import mutate

DECODES = {"wds": ("raw", "pil", "numpy"), "hdf5": ("raw", "pil", "numpy"), "npy": ("numpy", "pil")}
PEAK_LIMIT = 64 << 20  # the outputs are kilobytes: anything near this is an allocation the data declared


@pytest.fixture(scope="module")
def outputs(tmp_path_factory, photos):
    tmp = tmp_path_factory.mktemp("fuzz-outputs")
    src = str(tmp / "src")
    make_image_folder(src, photos, {"a": 3, "b": 3}, size=(16, 12))
    made = {}
    for fmt, extra in (("wds", {}), ("hdf5", {}), ("hdf5-decoded", {"decode": True}), ("npy", {})):
        made[fmt] = str(tmp / fmt)
        convert(src, made[fmt], fmt.split("-")[0], samples_per_shard=4, workers=1, **extra)
    return made


@st.composite
def damaged(draw, data: bytes) -> bytes:
    op = draw(st.sampled_from(["flip", "cut", "extend", "overwrite"]))
    if op == "cut" or not data:
        return data[: draw(st.integers(0, max(0, len(data) - 1)))]
    if op == "extend":
        return data + draw(st.binary(min_size=1, max_size=600))
    buf = bytearray(data)
    if op == "flip":
        for _ in range(draw(st.integers(1, 4))):
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    else:
        at = draw(st.integers(0, len(buf) - 1))
        run = draw(st.integers(1, 64))
        buf[at: at + run] = bytes([draw(st.sampled_from([0x00, 0xFF, 0x7F]))]) * len(buf[at: at + run])
    return bytes(buf)


def _agree(out: str) -> None:
    """The manifest's sizes and digests rewritten to match what is on disk now."""
    path = os.path.join(out, "dsconvert.json")
    try:
        manifest = json.load(open(path))
        for shard in manifest["shards"]:
            data = open(os.path.join(out, shard["name"]), "rb").read()
            shard.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        json.dump(manifest, open(path, "w"))
        rehash_parts(out)
    except (ValueError, KeyError, TypeError, AttributeError, OSError):
        pass  # the manifest itself was damaged: nothing to agree with


def _listing(*folders):
    return {f: sorted(os.listdir(f)) for f in folders}


@pytest.mark.parametrize("fmt", ["wds", "hdf5", "hdf5-decoded", "npy"])
@settings(max_examples=examples(45), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_a_damaged_output_gives_dsconvert_errors_only(tmp_path, outputs, fmt, data):
    with tempfile.TemporaryDirectory(dir=tmp_path) as parent:
        out = os.path.join(parent, "out")
        shutil.copytree(outputs[fmt], out)
        names = sorted(n for n in os.listdir(out) if not n.startswith("."))
        name = data.draw(st.sampled_from(names), label="file")
        path = os.path.join(out, name)
        original = open(path, "rb").read()
        if name.endswith(".json") and data.draw(st.booleans(), label="as JSON"):
            new = json.dumps(mutate(data, json.loads(original))).encode()
        else:
            new = data.draw(damaged(original), label="bytes")
        open(path, "wb").write(new)
        if data.draw(st.booleans(), label="manifest made to agree"):
            _agree(out)
        decode = data.draw(st.sampled_from(DECODES[fmt.split("-")[0]]), label="decode")
        if fmt == "hdf5-decoded" and decode == "raw":
            decode = "numpy"
        home = os.getcwd()
        # the temporary folder is this example's own: what other tests or processes make in the
        # shared one cannot be taken for something dsconvert left behind
        own_tmp = os.path.join(parent, "tmp")
        os.mkdir(own_tmp)
        before = _listing(parent, out)
        shared_tmp, tempfile.tempdir = tempfile.tempdir, own_tmp
        tracemalloc.start()
        try:
            os.chdir(parent)  # a relative write would land here
            try:
                ds = open_dataset(out, decode=decode)
                if fmt == "wds":
                    for _ in ds:
                        pass
                else:
                    for i in range(len(ds)):
                        try:
                            ds[i]
                        except DsconvertError as exc:  # a damaged sample or shard: the next may be fine
                            assert not isinstance(exc, ManifestError) or exc.args
            except DsconvertError:
                pass
            try:
                report = verify(out, decode=True, workers=1)
                assert isinstance(report["ok"], bool)
                if not report["ok"]:
                    assert report["problems"] and all(p["message"] for p in report["problems"])
            except ManifestError:
                pass  # an unreadable manifest: the one error verify raises
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
            tempfile.tempdir = shared_tmp
            os.chdir(home)
        assert peak < PEAK_LIMIT, f"{peak:,} bytes allocated for an output of kilobytes"
        assert _listing(parent, out) == before  # nothing written beside or into the output
        assert os.listdir(own_tmp) == []  # every temporary file or folder removed
