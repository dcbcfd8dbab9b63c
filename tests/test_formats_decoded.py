"""hdf5 and npy: round trips against PIL, readable without dsconvert, fork-safe readers."""

import os
import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from dsconvert import InsufficientSpaceError, OptionError, SourceError, convert, open_dataset
from dsconvert.codecs import resized_shape

from conftest import make_image_folder, pil_loader, reference_image_folder, write

h5py = pytest.importorskip("h5py")

# (format, convert options, decode modes to check)
CASES = [
    ("wds", {}, ("pil", "numpy", "raw")),
    ("hdf5", {}, ("pil", "numpy", "raw")),
    ("hdf5", {"decode": True, "decoder": "pil"}, ("pil", "numpy")),
    ("npy", {"decoder": "pil"}, ("pil", "numpy")),
    ("npy", {}, ("pil", "numpy")),  # the fastest decoder that loads
]


def _ids(case):
    fmt, opts, _ = case
    return fmt + "".join(f"-{k}={v}" for k, v in opts.items())


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_round_trip_against_pil(tmp_path, mixed_folder, case):
    fmt, opts, modes = case
    out = str(tmp_path / "out")
    m = convert(mixed_folder, out, format=fmt, samples_per_shard=3, workers=1, **opts).manifest
    assert m.num_samples == 7 and not m.skipped
    reference = reference_image_folder(mixed_folder)
    exact_jpeg = fmt == "wds" or not m.options.get("decode") or m.options.get("decoder") == "pil"
    for mode in modes:
        ds = open_dataset(out, decode=mode)
        assert len(ds) == 7
        samples = list(ds) if fmt == "wds" else [ds[i] for i in range(len(ds))]
        for (image, label), (path, ref_label) in zip(samples, reference):
            assert label == ref_label
            if mode == "raw":
                assert image == open(path, "rb").read()
                continue
            ref = np.asarray(pil_loader(path))
            got = np.asarray(image)
            assert got.shape == ref.shape and got.dtype == np.uint8, path
            if mode == "pil":
                assert image.mode == "RGB"
            if exact_jpeg or not path.lower().endswith(".jpg"):
                assert np.array_equal(got, ref), (mode, path)  # PNG always exact
            else:
                assert np.abs(got.astype(int) - ref).mean() <= 1.0, (mode, path)


def test_decoded_outputs_refuse_raw(tmp_path, image_folder):
    out = str(tmp_path / "npy")
    convert(image_folder, out, format="npy", workers=1)
    with pytest.raises(ValueError, match="no encoded bytes"):
        open_dataset(out, decode="raw")


def test_npy_views_are_zero_copy(tmp_path, image_folder):
    out = str(tmp_path / "npy")
    convert(image_folder, out, format="npy", workers=1)
    arr, _ = open_dataset(out, decode="numpy")[3]
    import mmap

    assert not arr.flags.owndata and not arr.flags.writeable
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, mmap.mmap)  # a view of the shard's memory map, not a copy


def test_npy_readable_with_numpy_alone(tmp_path, image_folder):
    out = tmp_path / "npy"
    convert(image_folder, str(out), format="npy", decoder="pil", samples_per_shard=10, workers=1)
    reference = reference_image_folder(image_folder)
    i = 0
    for shard in sorted(out.glob("shard-*.samples.npy")):
        pixels = np.load(str(shard).replace(".samples.npy", ".npy"), mmap_mode="r")
        for o, h, w, c, label in np.load(shard).tolist():
            image = np.asarray(pixels[o: o + h * w * c]).reshape(h, w, c)
            path, ref_label = reference[i]
            assert label == ref_label and np.array_equal(image, np.asarray(pil_loader(path)))
            i += 1
    assert i == 16


@pytest.mark.parametrize("decode", [False, True])
def test_hdf5_readable_with_h5py_alone(tmp_path, image_folder, decode):
    out = tmp_path / "h5"
    convert(image_folder, str(out), format="hdf5", decode=decode, decoder="pil", workers=1)
    reference = reference_image_folder(image_folder)
    with h5py.File(out / "shard-000000.h5", "r") as f:
        assert f.attrs["dsconvert_format"] == "hdf5"
        assert f.attrs["stored"] == ("decoded" if decode else "encoded")
        assert list(f["keys"].asstr()[:2]) == ["cat/cat_0000", "cat/cat_0001"]
        for i, (path, label) in enumerate(reference):
            assert f["labels"][i] == label
            if decode:
                image = f["images"][i].reshape(f["shapes"][i])
                assert np.array_equal(image, np.asarray(pil_loader(path)))
            else:
                assert f["images"][i].tobytes() == open(path, "rb").read()


@pytest.mark.parametrize("decode", [False, True])
def test_hdf5_readable_with_the_hdf5_tools(tmp_path, image_folder, decode):
    if not shutil.which("h5ls"):
        pytest.skip("h5ls (hdf5-tools) is not installed (apt-get install -y hdf5-tools)")
    out = tmp_path / "h5"
    convert(image_folder, str(out), format="hdf5", decode=decode, decoder="pil", workers=1)
    # Debian's HDF5 1.10 tools read the default file format
    listing = subprocess.run(["h5ls", str(out / "shard-000000.h5")], capture_output=True, text=True, check=True).stdout
    assert "images" in listing and "labels" in listing


def test_fixed_size_and_resize(tmp_path, photos):
    src = str(tmp_path / "src")
    make_image_folder(src, photos, {"a": 3, "b": 2}, size=(120, 80))
    out = str(tmp_path / "fixed")
    convert(src, out, format="hdf5", decode=True, size=(32, 48), decoder="pil", workers=1)
    with h5py.File(os.path.join(out, "shard-000000.h5")) as f:
        assert f["images"].shape == (5, 32, 48, 3) and f["images"].chunks == (1, 32, 48, 3)
    arr, _ = open_dataset(out, decode="numpy")[0]
    assert arr.shape == (32, 48, 3)
    out = str(tmp_path / "short")
    convert(src, out, format="npy", resize=40, decoder="pil", workers=1)
    ds = open_dataset(out, decode="numpy")
    reference = reference_image_folder(src)
    for i, (path, _) in enumerate(reference):
        ref = pil_loader(path)
        h, w = resized_shape(ref.height, ref.width, resize=40)
        assert (h, w) == (40, 60)  # torchvision's Resize(40) on 120x80 (w x h)
        expected = np.asarray(ref.resize((w, h), Image.Resampling.BILINEAR))
        assert np.array_equal(ds[i][0], expected)


@pytest.mark.parametrize("fmt", ["hdf5", "npy"])
def test_map_style_with_dataloader_workers(tmp_path, image_folder, fmt):
    torch = pytest.importorskip("torch")
    out = str(tmp_path / fmt)
    convert(image_folder, out, format=fmt, samples_per_shard=5, workers=1)
    ds = open_dataset(out, decode="numpy", transform=lambda a: torch.from_numpy(np.array(a[:8, :8])))
    ds[0]  # open a handle in the parent before the workers fork
    loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2, shuffle=True,
                                         generator=torch.Generator().manual_seed(0))
    labels = sorted(int(y) for _, ys in loader for y in ys)
    assert labels == sorted(label for _, label in reference_image_folder(image_folder))
    assert isinstance(ds, torch.utils.data.Dataset) and not isinstance(ds, torch.utils.data.IterableDataset)
    with pytest.raises(IndexError):
        ds[16]
    assert ds[-1][1] == ds[15][1]


@pytest.mark.parametrize("fmt, opts", [("hdf5", {}), ("hdf5", {"decode": True}), ("npy", {})])
def test_bad_inputs_deterministic_and_resumable(tmp_path, image_folder, image_kinds, fmt, opts):
    good = image_kinds["baseline"][1]
    write(os.path.join(image_folder, "dog", "truncated.jpg"), good[: len(good) // 2])
    write(os.path.join(image_folder, "dog", "zero.jpg"), b"")
    a = convert(image_folder, str(tmp_path / "a"), format=fmt, samples_per_shard=4, workers=1, **opts).manifest
    assert sorted(s["path"] for s in a.skipped) == ["dog/truncated.jpg", "dog/zero.jpg"]
    assert a.num_samples == 16
    b = str(tmp_path / "b")
    convert(image_folder, b, format=fmt, samples_per_shard=4, workers=2, **opts)
    names = sorted(os.listdir(tmp_path / "a"))
    assert names == sorted(os.listdir(b))
    for name in names:
        if not name.startswith("."):
            assert (tmp_path / "a" / name).read_bytes() == open(os.path.join(b, name), "rb").read(), name
    os.unlink(os.path.join(b, "dsconvert.json"))
    os.unlink(os.path.join(b, sorted(n for n in names if n.endswith(".idx"))[1]))
    again = convert(image_folder, b, format=fmt, samples_per_shard=4, workers=1, **opts)
    assert again.shards_written == 1 and again.shards_resumed == len(a.shards) - 1


def test_no_verify_still_skips_undecodable_images_for_pixels(tmp_path, image_folder):
    write(os.path.join(image_folder, "dog", "text.jpg"), b"not an image\n" * 10)
    m = convert(image_folder, str(tmp_path / "npy"), format="npy", verify=False, workers=1).manifest
    assert [s["path"] for s in m.skipped] == ["dog/text.jpg"]
    assert m.skipped[0]["reason"].startswith("cannot decode image")


def test_disk_space_refusal(tmp_path, image_folder, monkeypatch):
    from dsconvert.write import output

    monkeypatch.setattr(output, "free_bytes", lambda path: 10_000)  # a nearly full disk
    with pytest.raises(InsufficientSpaceError) as exc:
        convert(image_folder, str(tmp_path / "npy"), format="npy", workers=1)
    message = str(exc.value)
    # 16 images x 96 x 72 x 3 = 331,776 bytes of pixels + the shard's 128-byte .npy header
    assert "needs 331.9 kB (exact)" in message and "has 10.0 kB free" in message
    assert "--force" in message and "--resize" in message
    assert isinstance(exc.value, OSError)
    assert not os.path.exists(tmp_path / "npy" / "dsconvert.json")
    m = convert(image_folder, str(tmp_path / "npy"), format="npy", workers=1, force=True).manifest
    assert m.num_samples == 16 and m.shards[0].bytes == 331_904  # what the check said it needs
    monkeypatch.setattr(output, "free_bytes", lambda path: 10**12)
    convert(image_folder, str(tmp_path / "wds"), workers=1)


def test_decoded_size_estimate_is_exact_for_small_sets(image_folder):
    from dsconvert.sizing import estimate_output_bytes
    from dsconvert.source import scan

    source = scan(image_folder)
    est = estimate_output_bytes(source, decoded=True)
    assert est.exact and est.bytes == 16 * 96 * 72 * 3
    assert estimate_output_bytes(source, decoded=True, resize=36).bytes == 16 * 48 * 36 * 3
    assert estimate_output_bytes(source, decoded=False).bytes == source.nbytes
    sampled = estimate_output_bytes(source, decoded=True, sample=5)
    assert not sampled.exact and sampled.sampled == 5 and sampled.bytes == est.bytes


def test_option_errors(tmp_path, image_folder, photos):
    with pytest.raises(OptionError, match="decode=True needs"):
        convert(image_folder, str(tmp_path / "x"), format="wds", decode=True)
    with pytest.raises(OptionError, match="resize/size apply to decoded outputs"):
        convert(image_folder, str(tmp_path / "x"), format="hdf5", resize=32)
    flat = str(tmp_path / "flat")
    write(os.path.join(flat, "a.jpg"), open(reference_image_folder(image_folder)[0][0], "rb").read())
    write(os.path.join(flat, "a.json"), b"{}")
    with pytest.raises(SourceError, match="needs an ImageFolder or list source"):
        convert(flat, str(tmp_path / "y"), format="npy")


def _jpeg(path, photo, size, **save):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    photo.convert(save.pop("mode", "RGB")).resize(size, Image.Resampling.BICUBIC).save(path, "JPEG", **save)


def _text_page(size):
    from PIL import ImageDraw

    img = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(img)
    for row in range(0, size[1] - 12, 14):
        draw.text((8, row), "The quick brown fox jumps over the lazy dog 0123456789 " * 6, fill="black")
    return img


def test_resize_decodes_at_reduced_scale_within_a_level(tmp_path, photos):
    """A fast decoder decodes at 1/2, 1/4 or 1/8 DCT scale where that covers the resized output
    2.5 times over: the pixels stay within 1.5 mean levels (and 30 dB) of Pillow's full decode +
    bilinear resize, across sizes that are no multiple of 8, every chroma subsampling,
    progressive and grey JPEGs, a page of text, and small outputs; the same bytes from a pool of
    workers (one torch thread each) as from the main process."""
    from dsconvert.codecs import decode_resized, jpeg_decoders, scaled_eighths

    fast = [name for name, _ in jpeg_decoders() if name != "pil"]
    if not fast:
        pytest.skip("no libjpeg-turbo binding (PyTurboJPEG or simplejpeg) loads")
    src = str(tmp_path / "src")
    names = sorted(photos)
    cases = [((491, 373), {}), ((1203, 797), {"subsampling": 0}), ((640, 480), {"subsampling": 1}),
             ((900, 1300), {"progressive": True}), ((517, 389), {"mode": "L"}), ((300, 200), {}),
             ((1600, 1200), {"quality": 95}), ((1601, 1203), {"text": True})]
    for i, (size, save) in enumerate(cases):
        img = _text_page(size) if save.pop("text", False) else photos[names[i % len(names)]]
        _jpeg(os.path.join(src, f"c{i % 2}", f"{i}.jpg"), img, size, **{"quality": 90, **save})
    outs = {}
    for resize, workers in ((150, 2), (150, 1), (48, 1)):
        out = outs[(resize, workers)] = str(tmp_path / f"npy{resize}-{workers}")
        m = convert(src, out, format="npy", resize=resize, decoder=fast[0], workers=workers,
                    samples_per_shard=3).manifest
        assert m.options["scaled_decode"] is True and not m.skipped
        if workers == 2:
            continue
        ds = open_dataset(out, decode="numpy")
        scaled = 0
        for i, (path, _) in enumerate(reference_image_folder(src)):
            ref = pil_loader(path)
            h, w = resized_shape(ref.height, ref.width, resize=resize)
            expected = np.asarray(ref.resize((w, h), Image.Resampling.BILINEAR)).astype(np.int16)
            got = ds[i][0].astype(np.int16)
            assert got.shape == expected.shape
            mae = np.abs(got - expected).mean()
            psnr = 10 * np.log10(255 ** 2 / max(np.mean((got - expected) ** 2.0), 1e-9))
            assert mae < 1.5 and psnr > 30, (path, resize, mae, psnr)
            scaled += scaled_eighths(ref.height, ref.width, h, w) < 8
            with open(path, "rb") as f:  # the cache holds exactly what decode_resized gives
                assert np.array_equal(ds[i][0], decode_resized(f.read(), fast[0], resize, scaled=True,
                                                               resampler=m.options["resampler"]))
        assert scaled >= 3  # the large ones reached the reduced-scale path
    tree = [{name: open(os.path.join(d, name), "rb").read() for name in sorted(os.listdir(d))
             if not name.startswith(".")} for d in (outs[(150, 1)], outs[(150, 2)])]
    assert tree[0] == tree[1] and len(tree[0]) > 4
    # Pillow's exact pipeline stays: decoder="pil" records no scaled decoding
    m = convert(src, str(tmp_path / "pil"), format="npy", resize=150, decoder="pil", workers=1).manifest
    assert "scaled_decode" not in m.options and m.options["resampler"] == "pil"


def test_scaled_decode_falls_back_where_libjpeg_cannot(tmp_path, photos):
    """CMYK, a truncated JPEG and an enlargement take the full path: CMYK and enlargement
    as Pillow decodes and resizes them, the truncated file skipped with its reason as before."""
    from dsconvert.codecs import decode_resized, jpeg_decoders

    fast = [name for name, _ in jpeg_decoders() if name != "pil"]
    if not fast:
        pytest.skip("no libjpeg-turbo binding loads")
    src = str(tmp_path / "src")
    photo = next(iter(photos.values()))
    _jpeg(os.path.join(src, "a", "cmyk.jpg"), photo, (640, 480), mode="CMYK")
    _jpeg(os.path.join(src, "a", "small.jpg"), photo, (100, 80))
    _jpeg(os.path.join(src, "b", "whole.jpg"), photo, (640, 480))
    with open(os.path.join(src, "b", "whole.jpg"), "rb") as f:
        data = f.read()
    write(os.path.join(src, "b", "zcut.jpg"), data[: len(data) // 2])  # last: the others keep their index
    out = str(tmp_path / "out")
    m = convert(src, out, format="npy", resize=160, decoder=fast[0], workers=1, verify=False).manifest
    assert [os.path.basename(s["path"]) for s in m.skipped] == ["zcut.jpg"]
    assert "decode" in m.skipped[0]["reason"]
    ds = open_dataset(out, decode="numpy")
    for i, (path, _) in enumerate(reference_image_folder(src)):
        if path.endswith("zcut.jpg"):
            continue
        ref = pil_loader(path)
        h, w = resized_shape(ref.height, ref.width, resize=160)
        expected = np.asarray(ref.resize((w, h), Image.Resampling.BILINEAR))
        got = ds[i][0].astype(np.int16)
        with open(path, "rb") as f:
            assert np.array_equal(ds[i][0], decode_resized(f.read(), fast[0], 160, scaled=True,
                                                           resampler=m.options["resampler"]))
        # Pillow's decode and filter (torch's kernel differs by one level on a few pixels)
        assert np.abs(got - expected).mean() < (0.05 if path.endswith(("cmyk.jpg", "small.jpg")) else 1.5), path


@pytest.mark.parametrize("box", [None, "fractional"])
def test_torch_resampler_is_pillows_filter(photos, box):
    """The torch kernel, given Pillow's scales, makes Pillow's antialiased bilinear pixels:
    reductions with and without a fractional box, enlargements, odd sizes, one channel
    difference at most, on well under 1 % of the values."""
    pytest.importorskip("torch")
    from dsconvert.codecs import bilinear

    rng = np.random.default_rng(0)
    names = sorted(photos)
    for i, (h, w, oh, ow) in enumerate([(375, 500, 256, 341), (282, 368, 256, 334), (801, 1203, 224, 224),
                                        (80, 100, 160, 200), (97, 131, 45, 61), (600, 400, 600, 300)]):
        px = np.asarray(photos[names[i % len(names)]].convert("RGB").resize((w, h)))
        if box == "fractional" and oh < h - 1 and ow < w - 1:  # as the scaled decode's box: reductions only
            b = (w - rng.uniform(0.01, 0.99), h - rng.uniform(0.01, 0.99))
        else:
            b = None
        t = bilinear(px, oh, ow, b, "torch").astype(np.int16)
        p = bilinear(px, oh, ow, b, "pil").astype(np.int16)
        assert t.shape == p.shape == (oh, ow, 3)
        diff = np.abs(t - p)
        assert diff.max() <= 1 and (diff > 0).mean() < 0.01, (h, w, oh, ow, b, diff.max(), (diff > 0).mean())


@pytest.mark.parametrize("decoder", ["pil", "auto"])
def test_a_strip_that_resize_would_blow_up_is_a_counted_skip(tmp_path, photos, decoder):
    """A 2 x 40000 JPEG is 80,000 pixels, within any limit; `--resize 256` would make it
    256 x 5,120,000 (3.9 GB). It is skipped with its reason, the others are written, and the
    size estimate does not count it (so it cannot make the free-space check refuse the run)."""
    src = str(tmp_path / "src")
    photo = next(iter(photos.values()))
    _jpeg(os.path.join(src, "a", "ok.jpg"), photo, (120, 90))
    _jpeg(os.path.join(src, "a", "strip.jpg"), photo, (40000, 2))
    m = convert(src, str(tmp_path / "out"), format="npy", resize=256, decoder=decoder, workers=1).manifest
    assert m.num_samples == 1 and [os.path.basename(s["path"]) for s in m.skipped] == ["strip.jpg"]
    assert "exceeds the limit" in m.skipped[0]["reason"] and "256" in m.skipped[0]["reason"]
    from dsconvert.sizing import estimate_output_bytes
    from dsconvert.source import scan

    assert estimate_output_bytes(scan(src), decoded=True, resize=256).bytes == 256 * 341 * 3


@pytest.mark.slow
def test_a_tall_strip_at_a_fixed_size_does_not_take_gigabytes(tmp_path):
    """`--size 224x224` of a 1 x 2,000,000 PNG (within the pixel limit): torch's kernel would
    resize the width first through a 2,000,000 x 224 array (1.3 GB); Pillow's kernel takes it."""
    pytest.importorskip("torch")
    import sys

    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    Image.new("RGB", (1, 2_000_000), (10, 200, 30)).save(src / "tall.png")
    Image.new("RGB", (64, 48), (1, 2, 3)).save(src / "small.png")
    # the child's own peak, over what importing torch already took (RUSAGE_CHILDREN would be the
    # largest of every child this test process ever waited for)
    code = ("import resource, sys, torch; from dsconvert import convert; "
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
            "m = convert(sys.argv[1], sys.argv[2], 'npy', size=(224, 224), workers=1).manifest; "
            "assert m.num_samples == 2 and m.options['resampler'] == 'torch', m.options; "
            "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "src"), str(tmp_path / "out")], check=True,
                          capture_output=True, text=True)
    grown_mb = float(done.stdout.strip().splitlines()[-1])
    assert grown_mb < 600, grown_mb  # through torch's width-first resize: 1.3 GB more
    arr, _ = open_dataset(str(tmp_path / "out"), decode="numpy")[1]  # small.png sorts first
    assert arr.shape == (224, 224, 3) and abs(int(arr[100, 100, 1]) - 200) <= 1


def test_an_unidentifiable_image_has_the_same_reason_every_run(tmp_path, photos):
    """With --no-verify an image Pillow cannot identify is skipped when decoded; its reason must
    not name a Python object's address, or two runs would write different manifests."""
    src = str(tmp_path / "src")
    _jpeg(os.path.join(src, "a", "ok.jpg"), next(iter(photos.values())), (64, 48))
    write(os.path.join(src, "a", "junk.jpg"), b"\xff\xd8\xff" + b"junk" * 50)
    write(os.path.join(src, "a", "text.png"), b"not a png at all")
    reasons = []
    for run in range(2):
        m = convert(src, str(tmp_path / f"out{run}"), format="npy", resize=32, verify=False, workers=1).manifest
        reasons.append(sorted(s["reason"] for s in m.skipped))
    assert reasons[0] == reasons[1] and len(reasons[0]) == 2
    assert not any("0x" in r for r in reasons[0]), reasons[0]
