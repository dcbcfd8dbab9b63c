import os

import pytest

from dsconvert.io.localfs import evict_page_cache, is_latency_bound, mount_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mount_of_finds_the_longest_mount_point():
    assert mount_of("/proc/self/status") == ("/proc", "proc")
    point, fstype = mount_of(ROOT)
    assert ROOT.startswith(point) and fstype != "unknown"
    assert not is_latency_bound("/proc")


def test_evict_page_cache_counts_files(tmp_path):
    a = tmp_path / "a"
    a.write_bytes(b"x" * 100_000)
    assert evict_page_cache([str(a), str(tmp_path / "missing")]) == 1


@pytest.mark.slow
@pytest.mark.system
def test_fuse_mount_is_latency_bound_and_read_with_prefetch(slow_mount, photos):
    from dsconvert import convert, open_dataset

    from conftest import make_image_folder

    backing, mnt = slow_mount
    make_image_folder(str(backing / "src"), photos, {"a": 6, "b": 5})
    convert(str(backing / "src"), str(backing / "out"), samples_per_shard=4, workers=1)
    assert mount_of(str(mnt / "out"))[1].startswith("fuse")
    assert is_latency_bound(str(mnt / "out"))
    ds = open_dataset(str(mnt / "out"), decode="raw", stream=True)
    over_fuse = list(ds)
    assert ds.prefetch is True and len(over_fuse) == 11
    assert over_fuse == list(open_dataset(str(backing / "out"), decode="raw", stream=True))


def test_file_urls_name_the_paths_they_point_at(tmp_path, image_folder, monkeypatch):
    """file:// (and local://) URLs are what fsspec calls local paths: every entry point takes
    them for the path they name, never as a relative path under the current folder."""
    from dsconvert import convert, open_dataset
    from dsconvert.cli import main
    from dsconvert.verify import verify

    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert main(["shard", f"file://{image_folder}", "-o", f"file://{out}", "-q", "--workers", "1"]) == 0
    assert (out / "dsconvert.json").exists() and not (tmp_path / "file:").exists()
    assert len(open_dataset(f"file://{out}")) == len(open_dataset(str(out))) == 16
    assert verify(f"local://{out}", source=f"file://{image_folder}")["ok"]
    again = convert(f"file://{image_folder}", f"file://{out}", workers=1)
    assert again.already_complete
