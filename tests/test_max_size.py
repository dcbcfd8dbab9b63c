"""--max-size: images larger than the training resolution are re-encoded once, at conversion."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from PIL import Image

from dsconvert import convert, open_dataset
from dsconvert.convert import EXIT_SKIPPED
from dsconvert.errors import OptionError, OutputExistsError
from dsconvert.manifest import Manifest
from dsconvert.source import scan
from dsconvert.verify import verify

from conftest import encode, write


@pytest.fixture
def mixed_sizes(tmp_path, photos):
    """Large and small JPEGs, a large PNG, a large grayscale and CMYK JPEG, one corrupt file."""
    root = tmp_path / "src"
    rgb = photos["astronaut"].convert("RGB")
    files = {
        "a/big.jpg": encode(rgb.resize((400, 300)), quality=92),
        "a/tall.jpg": encode(rgb.resize((150, 500)), quality=80),
        "a/small.jpg": encode(rgb.resize((120, 90)), quality=85),
        "b/bigpng.png": encode(photos["rocket"].convert("RGB").resize((300, 260)), "PNG"),
        "b/gray.jpg": encode(photos["camera"].convert("L").resize((512, 512))),
        "b/cmyk.jpg": encode(rgb.resize((320, 200)).convert("CMYK")),
        "b/broken.jpg": encode(rgb.resize((400, 300)))[:900],
    }
    for name, data in files.items():
        write(str(root / name), data)
    return str(root), files


def stored_images(src: str, out: str):
    """Sample key -> stored bytes (outputs keep the source's ImageFolder order)."""
    keys = [s.key for s in scan(src).samples if not s.key.endswith("broken")]
    return dict(zip(keys, (raw for raw, _ in open_dataset(out, decode="raw"))))


@pytest.mark.parametrize("fmt", ["wds", "hdf5"])
def test_only_larger_images_are_reencoded_in_their_format(mixed_sizes, tmp_path, fmt):
    src, files = mixed_sizes
    out = str(tmp_path / fmt)
    result = convert(src, out, format=fmt, max_size=200, quality=80)
    m = result.manifest
    assert m.options["max_size"] == 200 and m.options["quality"] == 80
    assert m.num_samples == 6 and [s["path"] for s in m.skipped] == ["b/broken.jpg"]  # counted, with its reason
    images = stored_images(src, out)
    by_name = {k.rsplit("/", 1)[-1]: v for k, v in images.items()}
    assert by_name["small"] == files["a/small.jpg"]  # not larger: the same bytes
    expect = {"big": ((200, 150), "JPEG"), "tall": ((60, 200), "JPEG"), "bigpng": ((200, 173), "PNG"),
              "gray": ((200, 200), "JPEG"), "cmyk": ((200, 125), "JPEG")}
    for key, data in by_name.items():
        img = Image.open(io.BytesIO(data))
        assert max(img.size) <= 200, key
        if key in expect and expect[key]:
            assert (img.size, img.format) == expect[key], key
    pngs = [v for k, v in by_name.items() if Image.open(io.BytesIO(v)).format == "PNG"]
    assert len(pngs) == 1 and Image.open(io.BytesIO(pngs[0])).size == (200, 173)
    assert Image.open(io.BytesIO(by_name["gray"])).mode == "L"
    assert Image.open(io.BytesIO(by_name["cmyk"])).mode == "CMYK"
    assert verify(out, decode=True)["problems"] == []


def test_the_option_is_part_of_the_output(mixed_sizes, tmp_path):
    src, _ = mixed_sizes
    out = str(tmp_path / "out")
    convert(src, out, max_size=200)
    assert convert(src, out, max_size=200).already_complete
    with pytest.raises(OutputExistsError):
        convert(src, out, max_size=100)
    with pytest.raises(OutputExistsError):
        convert(src, out)  # without it: another output
    first = [s.sha256 for s in Manifest.load(out).shards]
    convert(src, out, max_size=200, overwrite=True)  # deterministic: the same shards again
    assert [s.sha256 for s in Manifest.load(out).shards] == first


def test_bad_options_are_one_line_errors(mixed_sizes, tmp_path):
    src, _ = mixed_sizes
    with pytest.raises(OptionError, match="decoded ones"):
        convert(src, str(tmp_path / "n"), format="npy", max_size=100)
    with pytest.raises(OptionError, match="quality"):
        convert(src, str(tmp_path / "q"), max_size=100, quality=0)
    run = subprocess.run([sys.executable, "-m", "dsconvert", "shard", src, "-o", str(tmp_path / "c"),
                          "--max-size", "100", "--quality", "101"], capture_output=True, text=True)
    assert run.returncode == 2 and "quality must be within 1..100" in run.stderr


def test_cli_max_size_and_info(mixed_sizes, tmp_path):
    src, _ = mixed_sizes
    out = str(tmp_path / "cli")
    run = subprocess.run([sys.executable, "-m", "dsconvert", "shard", src, "-o", out, "--max-size", "160", "-q"],
                         capture_output=True, text=True)
    assert run.returncode == EXIT_SKIPPED, run.stderr  # the broken file, counted
    info = subprocess.run([sys.executable, "-m", "dsconvert", "info", out], capture_output=True, text=True)
    assert "longer side at most 160" in info.stdout and "quality 90" in info.stdout
