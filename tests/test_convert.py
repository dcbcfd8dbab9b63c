"""Conversion guarantees: every input accounted for, strict mode, resume after SIGKILL,
no rewrite of a finished output, one writer per output."""

import os
import struct
import zlib

import pytest

from dsconvert import BadInputError, DsconvertError, OutputExistsError, OutputLockedError, convert
from dsconvert.cli import main

from conftest import encode, write


def _png_bomb(width=30000, height=30000):
    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 4096))
            + chunk(b"IEND", b""))


@pytest.fixture
def bad_tree(image_folder, image_kinds):
    good = image_kinds["baseline"][1]
    bad = {
        "cat/zero.jpg": b"",
        "cat/truncated.jpg": good[: len(good) // 2],
        "dog/random.jpg": os.urandom(3000),
        "dog/text.jpg": b"not an image at all\n" * 10,
        "zebra/bomb.png": _png_bomb(),
    }
    for rel, data in bad.items():
        write(os.path.join(image_folder, rel), data)
    os.symlink(image_folder, os.path.join(image_folder, "zebra", "loop"))
    os.symlink("missing.jpg", os.path.join(image_folder, "zebra", "dangling.jpg"))
    return image_folder, sorted(bad) + ["zebra/dangling.jpg", "zebra/loop"]


def test_every_bad_input_is_reported_and_accounted(tmp_path, bad_tree):
    src, bad = bad_tree
    m = convert(src, str(tmp_path / "out"), samples_per_shard=4, workers=2).manifest
    reasons = {s["path"]: s["reason"] for s in m.skipped}
    assert sorted(reasons) == bad
    assert reasons["cat/zero.jpg"].startswith("empty file")
    assert reasons["cat/truncated.jpg"].startswith("corrupt or truncated")
    assert reasons["dog/text.jpg"].startswith("not a decodable image")
    assert reasons["dog/random.jpg"].startswith("not a decodable image")
    assert reasons["zebra/bomb.png"].startswith("decompression bomb")
    assert reasons["zebra/loop"].startswith("symlink loop")
    assert reasons["zebra/dangling.jpg"] == "broken symlink"
    assert m.num_samples == 16
    a = m.accounting
    assert a["files_seen"] == a["files_written"] + a["files_skipped"] == 16 + len(bad)


def test_no_verify_only_drops_what_cannot_be_an_image(tmp_path, bad_tree):
    src, _ = bad_tree
    m = convert(src, str(tmp_path / "out"), verify=False, workers=1).manifest
    assert {s["path"] for s in m.skipped} == {"cat/zero.jpg", "zebra/dangling.jpg", "zebra/loop"}
    assert m.num_samples == 16 + 4


def test_cli_exit_status_says_whether_inputs_were_skipped(tmp_path, bad_tree, image_folder, capsys):
    src, _ = bad_tree
    assert main(["shard", src, "-o", str(tmp_path / "out"), "-q"]) == 3
    assert main(["shard", src, "-o", str(tmp_path / "strict"), "--strict", "-q"]) == 1
    err = capsys.readouterr().err
    assert "dsconvert: error:" in err and "Traceback" not in err
    assert not os.path.exists(tmp_path / "strict" / "dsconvert.json")


def test_strict_raises_on_first_bad_file(tmp_path, image_folder):
    write(os.path.join(image_folder, "dog", "zzz.jpg"), b"garbage")
    with pytest.raises(BadInputError) as exc:
        convert(image_folder, str(tmp_path / "out"), strict=True, workers=1)
    assert exc.value.path == "dog/zzz.jpg"
    assert isinstance(exc.value, ValueError)


def test_clean_run_exit_zero(tmp_path, image_folder, capsys):
    assert main(["shard", image_folder, "-o", str(tmp_path / "out"), "--workers", "2"]) == 0
    out = capsys.readouterr()
    assert "wrote 16 samples in 1 wds shard(s)" in out.out
    assert main(["info", str(tmp_path / "out")]) == 0
    assert "16 seen = 16 written + 0 skipped" in capsys.readouterr().out


def test_finished_output_is_not_rewritten(tmp_path, image_folder):
    out = str(tmp_path / "out")
    convert(image_folder, out, workers=1)
    before = {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in os.listdir(out)}
    again = convert(image_folder, out, workers=1)
    assert again.already_complete
    assert {n: os.stat(os.path.join(out, n)).st_mtime_ns for n in os.listdir(out)} == before
    with pytest.raises(OutputExistsError, match="--overwrite"):
        convert(image_folder, out, samples_per_shard=3, workers=1)
    m = convert(image_folder, out, samples_per_shard=3, workers=1, overwrite=True).manifest
    assert len(m.shards) == 6
    assert sorted(n for n in os.listdir(out) if n.endswith(".tar")) == [s.name for s in m.shards]


def test_changed_plan_without_manifest_removes_stale_shards(tmp_path, image_folder):
    out = str(tmp_path / "out")
    convert(image_folder, out, samples_per_shard=2, workers=1)
    os.unlink(os.path.join(out, "dsconvert.json"))  # as if killed before the manifest
    # named like a temporary file, but not journalled as one: no proof it is ours, so it stays
    write(os.path.join(out, ".shard-000003.tar.4242.tmp"), b"half a shard?")
    write(os.path.join(out, "notes.txt"), b"the user's own file stays")
    m = convert(image_folder, out, samples_per_shard=8, workers=1).manifest
    assert sorted(os.listdir(out)) == sorted(
        [".dsconvert.lock", ".dsconvert.owner", "notes.txt", ".shard-000003.tar.4242.tmp"] + m.own_files()
        + [n for s in m.shards for n in (s.name, s.index)])


def test_a_changed_source_file_is_rewritten_on_resume(tmp_path, image_folder, photos):
    out = str(tmp_path / "out")
    convert(image_folder, out, samples_per_shard=4, workers=1)
    os.unlink(os.path.join(out, "dsconvert.json"))
    path = os.path.join(image_folder, "dog", "dog_0001.jpg")
    write(path, encode(photos["rocket"].resize((50, 50))))
    result = convert(image_folder, out, samples_per_shard=4, workers=1)
    assert result.shards_written == 1 and result.shards_resumed == 3


def test_second_writer_is_refused(tmp_path, image_folder):
    """The lock is a POSIX record lock held by another process (what a second dsconvert takes)."""
    import subprocess
    import sys

    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(out / '.dsconvert.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\nsys.stdin.read()\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(OutputLockedError, match="another dsconvert process"):
            convert(image_folder, str(out), workers=1)
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    convert(image_folder, str(out), workers=1)


def test_one_process_cannot_take_its_own_output_twice(tmp_path, image_folder):
    from dsconvert.write.output import output_lock

    (tmp_path / "out").mkdir()
    with output_lock(str(tmp_path / "out")):
        with pytest.raises(OutputLockedError):
            convert(image_folder, str(tmp_path / "out"), workers=1)


def test_output_inside_source_is_refused(image_folder):
    with pytest.raises(DsconvertError, match="inside the source"):
        convert(image_folder, os.path.join(image_folder, "out"))


def test_file_vanishing_before_its_shard_is_skipped_as_unreadable(tmp_path, image_folder):
    from dsconvert.formats.wds import Wds
    from dsconvert.inputs import read_samples
    from dsconvert.plan import ShardSpec
    from dsconvert.source import scan

    source = scan(image_folder)
    os.unlink(os.path.join(image_folder, source.samples[2].files[0].path))
    out = tmp_path / "out"
    out.mkdir()
    spec = ShardSpec("wds", 0, "shard-000000.tar", source.root, str(out), "classification",
                     tuple(source.samples))
    result = Wds.write_shard(spec, read_samples(spec))
    assert result.entry.num_samples == 15
    assert [(s.path, s.reason) for s in result.skipped] == [
        (source.samples[2].files[0].path, "unreadable: No such file or directory")]


def test_errors_keep_their_path_across_processes():
    import pickle

    err = pickle.loads(pickle.dumps(BadInputError("empty file (0 bytes)", "cat/x.jpg")))
    assert (err.reason, err.path, str(err)) == ("empty file (0 bytes)", "cat/x.jpg", "cat/x.jpg: empty file (0 bytes)")


def test_strict_with_a_process_pool(tmp_path, image_folder):
    write(os.path.join(image_folder, "dog", "zzz.jpg"), b"garbage")
    with pytest.raises(BadInputError) as exc:
        convert(image_folder, str(tmp_path / "out"), strict=True, workers=2, samples_per_shard=3)
    assert exc.value.path == "dog/zzz.jpg"


def test_file_changed_after_the_scan_is_skipped_then_included_by_a_rerun(tmp_path, image_folder, photos):
    from dsconvert.formats.wds import Wds
    from dsconvert.inputs import read_samples
    from dsconvert.io.location import Location
    from dsconvert.io.owner import owner_token
    from dsconvert.plan import ShardSpec
    from dsconvert.source import scan

    source = scan(image_folder)
    victim = source.samples[3].files[0].path
    write(os.path.join(image_folder, victim), encode(photos["rocket"].resize((40, 30))))  # after the scan
    out = tmp_path / "out"
    out.mkdir()
    (out / ".dsconvert.lock").touch()  # the folder is a dsconvert output, as a conversion's first step makes it
    owner = owner_token(Location(str(out)))  # ... and its writers note what they write under its token
    spec = ShardSpec("wds", 0, "shard-000000.tar", source.root, str(out), "classification", tuple(source.samples),
                     owner=owner)
    result = Wds.write_shard(spec, read_samples(spec))
    assert result.entry.num_samples == 15
    assert [s.path for s in result.skipped] == [victim]
    assert result.skipped[0].reason.startswith("changed during the conversion")
    m = convert(image_folder, str(out), workers=1).manifest  # the rerun rescans and includes it
    assert m.num_samples == 16 and m.skipped == []
