import json
import os

import pytest

from dsconvert import Manifest, ManifestError
from dsconvert.manifest import SCHEMA_VERSION, ShardEntry


def make() -> Manifest:
    return Manifest(
        format="wds", source={"url": "/data", "layout": "imagefolder"}, sample_type="classification",
        classes=["cat", os.fsdecode(b"d\xf6g"), "100%"], fields={"jpg": "image", "cls": "class"},
        num_samples=3, shards=[ShardEntry("shard-000000.tar", 3, 4096, "ab" * 32, "shard-000000.index.json")],
        skipped=[{"path": "x.jpg", "reason": "empty file (0 bytes)"}],
    )


def test_round_trip(tmp_path):
    m = make()
    m.save(str(tmp_path))
    raw = (tmp_path / "dsconvert.json").read_bytes()
    raw.decode("utf-8")  # strict UTF-8 even with an undecodable class name
    assert json.loads(raw)["schema_version"] == SCHEMA_VERSION
    back = Manifest.load(str(tmp_path))
    assert back == m
    assert oct(os.stat(tmp_path / "dsconvert.json").st_mode & 0o777) == "0o644"


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("format"), "format"),
    (lambda d: d.update(num_samples="3"), "num_samples"),
    (lambda d: d.update(num_samples=4), "num_samples"),
    (lambda d: d["shards"][0].update(name="../evil.tar"), "shards[0].name"),
    (lambda d: d["shards"][0].update(index="/etc/passwd"), "shards[0].index"),
    (lambda d: d["shards"][0].pop("sha256"), "shards[0].sha256"),
    (lambda d: d.update(sample_type="video"), "sample_type"),
    (lambda d: d.update(classes=[1, 2]), "classes"),
    (lambda d: d.update(classes=["cat%", "dog"]), "classes"),  # found by tests/support/fuzz_readers.py
    (lambda d: d.update(classes=["%zz"]), "classes"),
    (lambda d: d.update(skipped=[{"path": "x"}]), "skipped"),
])
def test_malformed_manifest_names_the_field(tmp_path, mutate, field):
    d = make().to_dict()
    mutate(d)
    (tmp_path / "dsconvert.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError) as exc:
        Manifest.load(str(tmp_path))
    assert f"field '{field}'" in str(exc.value)


def test_unreadable_manifests(tmp_path):
    with pytest.raises(ManifestError, match="no dsconvert.json"):
        Manifest.load(str(tmp_path))
    (tmp_path / "dsconvert.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        Manifest.load(str(tmp_path))
    d = make().to_dict()
    d["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "dsconvert.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="newer than this dsconvert"):
        Manifest.load(str(tmp_path))
    assert issubclass(ManifestError, ValueError)
