"""decode="fused": the transform's crop and resize folded into decoding.

Every fused result is compared with the unfused one on the same crop box: the full decode by
Pillow, then Pillow's resize (what torchvision does to the PIL image an ImageFolder gives).
Where torchvision imports, the same seeded run must crop exactly torchvision's boxes."""

from __future__ import annotations

import io
import math
import random

import numpy as np
import pytest
from PIL import Image

from dsconvert import convert, fused as fz, open_dataset, open_source
from dsconvert.errors import BadInputError
from dsconvert.geometry import resized_size
from dsconvert.transforms import CropToTensor, RandomResizedCropToTensor

from conftest import encode, make_image_folder

pytestmark = pytest.mark.usefixtures("torch")


def pillow_only(monkeypatch) -> None:
    """No libjpeg binding: neither PyTurboJPEG nor dsconvert's region extension."""
    monkeypatch.setattr(fz, "jpeg_decoders", lambda: [("pil", lambda d: None)])
    monkeypatch.setattr(fz, "region_decode", lambda *args: None)


def pil_full(data: bytes) -> Image.Image:
    return Image.open(io.BytesIO(data)).convert("RGB")


def reference_rrc(data: bytes, box, size: int) -> np.ndarray:
    top, left, h, w = box
    img = pil_full(data).resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    return np.asarray(img).transpose(2, 0, 1)


def reference_eval(data: bytes, resize: int, size: int) -> np.ndarray:
    img = pil_full(data)
    h, w = resized_size(img.size[1], img.size[0], resize)
    img = img.resize((w, h), Image.Resampling.BILINEAR)
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return np.asarray(img.crop((left, top, left + size, top + size))).transpose(2, 0, 1)


@pytest.fixture(scope="module")
def large_jpegs(photos):
    """Photographs upscaled to sizes where the DCT-domain reductions apply (2/4/8)."""
    out = []
    for i, (_, photo) in enumerate(sorted(photos.items())):
        size = [(2400, 1800), (1600, 1200), (1100, 820), (700, 520), (480, 360)][i % 5]
        out.append(encode(photo.convert("RGB").resize(size, Image.Resampling.BICUBIC), quality=90))
    return out


def test_fused_resize_of_a_text_page_stays_near_torchvisions(torch):
    """Fine detail is where the DCT scaling's filter differs most from the bilinear one: with
    no margin a page of text resized to 256 was 5.8 mean levels off (8.4 at 128)."""
    from PIL import ImageDraw

    page = Image.new("RGB", (1601, 1203), "white")
    draw = ImageDraw.Draw(page)
    for row in range(0, 1190, 14):
        draw.text((8, row), "The quick brown fox jumps over the lazy dog 0123456789 " * 6, fill="black")
    data = encode(page, quality=90)
    for resize in (256, 128, 64):
        t = fz.fuse(CropToTensor(resize * 7 // 8, resize=resize))
        ref = reference_eval(data, resize, resize * 7 // 8)
        assert mean_abs(t.from_bytes(data).numpy(), ref) < 1.5, resize


def mean_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).mean())


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(((a.astype(np.float64) - b.astype(np.float64)) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


# --- geometry ----------------------------------------------------------------------------


def ks_distance(a, b) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())


@pytest.mark.parametrize("height,width", [(375, 500), (500, 200), (64, 64)])
def test_rrc_boxes_follow_torchvisions_distribution(torch, height, width):
    """Against the reference port of ``RandomResizedCrop.get_params`` drawn from Python's
    generator (an independent stream): area, aspect ratio and position distributions agree
    (two-sample KS at 4000 draws; 0.044 is the 0.1% critical value)."""
    torch.manual_seed(0)
    rng = random.Random(0)
    ref = RandomResizedCropToTensor(224)
    ours = [fz.rrc_box(height, width, (0.08, 1.0), (3 / 4, 4 / 3)) for _ in range(4000)]
    theirs = [ref.box(width, height, rng) for _ in range(4000)]
    for box in ours:
        top, left, h, w = box
        assert 0 <= top and 0 <= left and 0 < h and 0 < w and top + h <= height and left + w <= width
    for stat in (lambda b: b[2] * b[3], lambda b: math.log(b[3] / b[2]), lambda b: b[0], lambda b: b[1]):
        assert ks_distance([stat(b) for b in ours], [stat(b) for b in theirs]) < 0.044


def test_rrc_boxes_are_torchvisions_get_params_draw_for_draw(torch):
    """The same seed gives torchvision's boxes and leaves torch's generator where
    torchvision's leaves it (the next draw, a flip, agrees): 2,000 random sizes, scales and
    ratios, the fallback after ten refused draws included."""
    tv = pytest.importorskip("torchvision.transforms")
    rng = random.Random(5)
    for _ in range(2000):
        height, width = rng.randint(1, 3000), rng.randint(1, 3000)
        scale = tuple(sorted((rng.uniform(0.01, 1.0), rng.uniform(0.01, 1.0))))
        ratio = tuple(sorted((rng.uniform(0.1, 1.5), rng.uniform(0.5, 8.0))))
        seed = rng.randrange(1 << 30)
        torch.manual_seed(seed)
        ours = [fz.rrc_box(height, width, scale, ratio) for _ in range(2)], torch.rand(1)
        torch.manual_seed(seed)
        image = torch.empty(1, height, width)
        theirs = [tuple(tv.RandomResizedCrop.get_params(image, scale, ratio)) for _ in range(2)], torch.rand(1)
        assert ours[0] == theirs[0] and torch.equal(ours[1], theirs[1]), (height, width, scale, ratio, seed)


def test_rrc_falls_back_to_the_centre_crop_like_torchvision(torch):
    torch.manual_seed(0)
    # a 10:1 strip can never hold a crop of ratio <= 4/3 and area >= 8%... only the fallback
    assert fz.rrc_box(10, 1000, (0.9, 1.0), (3 / 4, 4 / 3)) == (0, (1000 - 13) // 2, 10, 13)
    assert fz.rrc_box(1000, 10, (0.9, 1.0), (3 / 4, 4 / 3)) == ((1000 - 13) // 2, 0, 13, 10)


def test_the_largest_reduction_that_keeps_the_output_size():
    """... 2.5 times over (DCT_MARGIN): the bilinear filter still does most of the reduction."""
    assert fz._reduction(1800, 2400, 224, 224) == 2
    assert fz._reduction(1800, 2400, 256, 341) == 2
    assert fz._reduction(4000, 4000, 100, 100) == 8
    assert fz._reduction(375, 500, 224, 224) == 1
    assert fz._reduction(900, 900, 180, 180) == 2
    assert fz._reduction(900, 900, 181, 10) == 1


def test_resized_size_is_torchvisions():
    assert resized_size(375, 500, 256) == (256, 341)
    assert resized_size(500, 375, 256) == (341, 256)
    assert resized_size(375, 500, (100, 200)) == (100, 200)
    assert resized_size(100, 1000, 256, max_size=512) == (51, 512)


# --- pixels ------------------------------------------------------------------------------


@pytest.mark.parametrize("decoder", ["fast", pytest.param("pillow", marks=pytest.mark.slow)])
def test_fused_rrc_matches_full_decode_then_pillow_on_the_same_box(torch, large_jpegs, monkeypatch, decoder):
    if decoder == "pillow":  # no libjpeg-turbo binding: Pillow's draft reduces instead
        pillow_only(monkeypatch)
    t = fz.fuse(RandomResizedCropToTensor(224, flip=0.0))
    worst, reductions = 0.0, set()
    for seed in range(12):
        for data in large_jpegs:
            torch.manual_seed(seed)
            img = pil_full(data)
            box = fz.rrc_box(img.size[1], img.size[0], t.geometry.scale, t.geometry.ratio)
            reductions.add(fz._reduction(img.size[1], img.size[0], 224 * img.size[1] / box[2],
                                         224 * img.size[0] / box[3]))
            torch.manual_seed(seed)
            out = t.from_bytes(data).numpy()
            assert out.shape == (3, 224, 224) and out.dtype == np.uint8
            ref = reference_rrc(data, box, 224)
            worst = max(worst, mean_abs(out, ref))
            assert psnr(out, ref) > 30
    assert worst < 1.5
    assert {1, 2} <= reductions  # the test reached the DCT-scaled paths


@pytest.mark.parametrize("decoder", ["fast", "pillow"])
def test_fused_resize_centre_crop_matches_pillow(torch, large_jpegs, monkeypatch, decoder):
    if decoder == "pillow":
        pillow_only(monkeypatch)
    t = fz.fuse(CropToTensor(224, resize=256))
    for data in large_jpegs:
        out = t.from_bytes(data).numpy()
        ref = reference_eval(data, 256, 224)
        assert out.shape == ref.shape == (3, 224, 224)
        assert mean_abs(out, ref) < 1.5 and psnr(out, ref) > 30


def test_images_the_fast_decoder_refuses_decode_in_full_and_match_the_pil_path(torch, image_kinds):
    """CMYK, PNG (also named .JPEG), grayscale, progressive: the same pixels as decode="pil"
    then the transform, on the same seed."""
    rrc = RandomResizedCropToTensor(32, flip=0.5)
    t = fz.fuse(rrc)
    for name, (_, data) in image_kinds.items():
        torch.manual_seed(3)
        out = t.from_bytes(data).numpy()
        torch.manual_seed(3)
        img = pil_full(data)
        box = fz.rrc_box(img.size[1], img.size[0], rrc.scale, rrc.ratio)
        flip = torch.rand(1).item() < 0.5
        ref = reference_rrc(data, box, 32)
        if flip:
            ref = ref[:, :, ::-1]
        assert mean_abs(out, ref) < 1.5, name


def test_an_unrecognised_transform_is_applied_as_given_to_the_pil_image(image_kinds):
    seen = []
    t = fz.fuse(lambda img: seen.append(img) or "done")
    assert t.geometry is None
    assert t.from_bytes(image_kinds["baseline"][1]) == "done"
    assert isinstance(seen[0], Image.Image) and seen[0].mode == "RGB"
    assert fz.fuse(None).from_bytes(image_kinds["png"][1]).mode == "RGB"


def test_decoded_pixels_get_the_same_geometry(torch, large_jpegs):
    t = fz.fuse(CropToTensor(224, resize=256))
    data = large_jpegs[-1]
    out = t.from_pixels(np.asarray(pil_full(data))).numpy()
    assert mean_abs(out, reference_eval(data, 256, 224)) < 0.2
    gray = t.from_pixels(np.asarray(pil_full(data).convert("L")))
    assert tuple(gray.shape) == (3, 224, 224)


def test_hostile_jpegs_raise_bad_input(torch, photos):
    t = fz.fuse(RandomResizedCropToTensor(64))
    good = encode(photos["astronaut"].convert("RGB"), quality=90)
    # what Pillow raises for a corrupt image, which the readers name the sample with (decode_errors_naming)
    corrupt = (BadInputError, OSError, SyntaxError, ValueError)
    with pytest.raises(corrupt):
        t.from_bytes(good[: len(good) // 3])  # truncated: Pillow refuses it, as decode="pil" does
    # a header declaring 40000 x 40000 pixels: refused before anything is allocated
    bomb = bytearray(good)
    at = bomb.index(b"\xff\xc0") + 5
    bomb[at:at + 4] = (40000).to_bytes(2, "big") + (40000).to_bytes(2, "big")
    with pytest.raises(BadInputError, match="decompression bomb"):
        t.from_bytes(bytes(bomb))
    # noise after the JPEG magic (some of it parses as a header declaring 0 x N pixels), for every
    # geometry: an error from the decoders, never a crash of the fused path's arithmetic
    rng = random.Random(11)
    for other in (CropToTensor(64, resize=72), RandomResizedCropToTensor(64)):
        f = fz.fuse(other)
        for _ in range(300):
            noise = b"\xff\xd8\xff" + bytes(rng.randrange(256) for _ in range(rng.randrange(4, 400)))
            with pytest.raises(corrupt):
                f.from_bytes(noise)
    zero = bytearray(good)
    zero[at:at + 4] = bytes(4)  # a frame of 0 x 0 pixels
    with pytest.raises(corrupt):
        t.from_bytes(bytes(zero))


# --- through the readers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory, photos):
    root = str(tmp_path_factory.mktemp("fused") / "photos")
    make_image_folder(root, photos, {"a": 12, "b": 12}, size=(300, 220))
    return root


@pytest.mark.parametrize("fmt,extra", [("wds", {}), ("hdf5", {}), ("npy", {"resize": 256})])
def test_every_format_reads_fused_as_the_pil_path(torch, folder, tmp_path, fmt, extra):
    out = str(tmp_path / fmt)
    convert(folder, out, format=fmt, **extra)
    T = CropToTensor(160, resize=180)
    a = open_dataset(out, transform=T, decode="pil")
    b = open_dataset(out, transform=T, decode="fused")
    pairs = list(zip(a, b))
    assert len(pairs) == 24
    for (x, y), (u, v) in pairs:
        assert y == v and tuple(u.shape) == tuple(x.shape) == (3, 160, 160)
        assert mean_abs(x.numpy(), u.numpy()) < 1.0


def test_fused_source_through_a_dataloader_with_workers(torch, folder):
    from torch.utils.data import DataLoader

    ds = open_source(folder, transform=RandomResizedCropToTensor(96), decode="fused")
    seen = 0
    for images, labels in DataLoader(ds, batch_size=8, num_workers=2):
        assert images.dtype == torch.uint8 and tuple(images.shape[1:]) == (3, 96, 96)
        seen += len(labels)
    assert seen == 24


def test_fused_needs_image_samples(tmp_path, photos):
    src = tmp_path / "flat"
    src.mkdir()
    for i in range(3):
        (src / f"{i}.jpg").write_bytes(encode(photos["coffee"].convert("RGB").resize((64, 48))))
        (src / f"{i}.json").write_text("{}")
    convert(str(src), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="fused"):
        open_dataset(str(tmp_path / "out"), decode="fused")


# --- torchvision's own transforms ----------------------------------------------------------


def torchvision_pipelines():
    T1 = pytest.importorskip("torchvision.transforms", reason="torchvision does not import here")
    import torch
    import torchvision.transforms.v2 as T2

    return {
        "v1 train": T1.Compose([T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(), T1.PILToTensor()]),
        "v2 train": T2.Compose([T2.RandomResizedCrop(224), T2.RandomHorizontalFlip(), T2.PILToTensor()]),
        "v1 eval": T1.Compose([T1.Resize(256), T1.CenterCrop(224), T1.PILToTensor()]),
        "v2 eval": T2.Compose([T2.Resize(256), T2.CenterCrop(224), T2.ToImage(),
                               T2.ToDtype(torch.float32, scale=True)]),
        "v1 normalize": T1.Compose([T1.Resize(256), T1.CenterCrop(224), T1.ToTensor(),
                                    T1.Normalize([0.5] * 3, [0.2] * 3)]),
        "bicubic, PIL out": T1.Compose([T1.RandomResizedCrop(160, interpolation=T1.InterpolationMode.BICUBIC)]),
        "random crop": T1.Compose([T1.RandomCrop(200), T1.PILToTensor()]),
        "resize only": T1.Compose([T1.Resize((120, 90)), T1.PILToTensor()]),
        "not fused": T1.Compose([T1.ColorJitter(0.1), T1.RandomResizedCrop(64), T1.PILToTensor()]),
        "v2 ToImage first": T2.Compose([T2.ToImage(), T2.RandomResizedCrop(224), T2.RandomHorizontalFlip(),
                                        T2.ToDtype(torch.float32, scale=True),
                                        T2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]),
        "v2 PILToTensor first, eval": T2.Compose([T2.PILToTensor(), T2.Resize(256), T2.CenterCrop(224)]),
        "v2 no antialias": T2.Compose([T2.ToImage(), T2.Resize(256, antialias=False), T2.CenterCrop(224)]),
        "v1 flip p=0": T1.Compose([T1.RandomResizedCrop(224), T1.RandomHorizontalFlip(p=0.0), T1.PILToTensor()]),
    }


@pytest.mark.parametrize("order", ["ToImage first", "ToImage last"])
def test_a_centre_crop_larger_than_the_resize_gets_torchvisions_padding_and_type(torch, order):
    """A crop larger than the resized image is padded by torchvision: not fused, the rest of the
    transform runs as given after the resize, and v2's ToImage before the Resize still runs
    (a review found the sample left a PIL image)."""
    pytest.importorskip("torchvision.transforms", reason="torchvision does not import here")
    import torchvision.transforms.v2 as T2

    data = encode(Image.fromarray(np.random.default_rng(0).integers(0, 256, (100, 1000, 3), dtype=np.uint8)),
                  quality=95)
    for ops in ([T2.Resize(200, max_size=240), T2.CenterCrop(180)], [T2.Resize((50, 120)), T2.CenterCrop(100)]):
        T = T2.Compose([T2.ToImage()] + ops if order == "ToImage first" else ops + [T2.ToImage()])
        got, want = fz.fuse(T).from_bytes(data), T(pil_full(data))
        assert type(got) is type(want) and got.shape == want.shape
        if order == "ToImage first":  # torch's resize on both sides: the same pixels
            assert torch.equal(got.as_subclass(torch.Tensor), want.as_subclass(torch.Tensor))


@pytest.mark.parametrize("name", ["v1 train", "v2 train", "v1 eval", "v2 eval", "v1 normalize",
                                  "bicubic, PIL out", "random crop", "resize only", "not fused",
                                  "v2 ToImage first", "v2 PILToTensor first, eval", "v2 no antialias",
                                  "v1 flip p=0"])
def test_torchvision_transforms_same_seed_same_boxes(torch, folder, tmp_path, name):
    T = torchvision_pipelines()[name]
    out = str(tmp_path / "wds")
    convert(folder, out)
    a = open_dataset(out, transform=T, decode="pil")
    b = open_dataset(out, transform=T, decode="fused")
    assert (b.fused.geometry is None) == (name in ("not fused", "v2 no antialias"))
    torch.manual_seed(0)
    A = list(a)
    torch.manual_seed(0)
    B = list(b)
    for (x, y), (u, v) in zip(A, B):
        assert y == v and type(x) is type(u)
        xa = x.double().numpy() if torch.is_tensor(x) else np.asarray(x, dtype=np.float64)
        ua = u.double().numpy() if torch.is_tensor(u) else np.asarray(u, dtype=np.float64)
        assert xa.shape == ua.shape
        assert np.abs(xa - ua).mean() < (0.01 if xa.max() <= 10 else 0.5), name  # same box, same flip


def test_the_pillow_fallback_reports_the_scale_draft_chose(torch, monkeypatch):
    pillow_only(monkeypatch)
    data = encode(Image.new("RGB", (17, 2000), (10, 200, 30)), quality=90)
    pixels, k, origin = fz._decode(data, lambda h, w: (1, 1))
    # 1/4 covers 17 / 4 = 4.25 >= 2.5 columns: draft is asked for 17 // 4 = 4 of them, takes
    # 1/4 (the largest scale <= 17 // 4), as libjpeg-turbo would, and rounds 17 / 4 up to 5
    # columns: the scale is draft's (17 / 4.25), not 17 // 5 (asking for 5, ceil(17 / 4), made
    # draft take 1/2: a review found the sample then depended on the decoders installed)
    assert k == 4 and pixels.shape[:2] == (500, 5) and origin == (0, 0)
    for width in range(1, 300):  # draft reduces exactly as asked whatever the size
        for k in (2, 4, 8):
            img = Image.new("RGB", (width, 40 * k))
            jpeg = encode(img, quality=90)
            if width >= k:
                pixels, got, _ = fz._decode(jpeg, lambda h, w, k=k: (h / k / 2.5, w / k / 2.5))
                assert got == k and pixels.shape[1] == -(-width // k), (width, k)


def test_eval_is_the_reference_transform_pixel_for_pixel(torch, photos):
    """CropToTensor and the fused Resize + CenterCrop resize to torchvision's size (the longer
    side truncated), so they agree on every aspect ratio, 640x427 included."""
    ref = CropToTensor(224, resize=256)
    t = fz.fuse(ref)
    for size in ((640, 427), (500, 375), (427, 640), (301, 257)):
        data = encode(photos["coffee"].convert("RGB").resize(size), quality=95)
        assert mean_abs(t.from_bytes(data).numpy(), ref(pil_full(data)).numpy()) < 0.1, size


def test_a_resize_that_would_amplify_a_thin_image_is_refused(torch):
    """A 4 kB JPEG of 12000 x 1 pixels would be resized to 3 million x 256 before the centre
    crop: refused like a decompression bomb, not allocated."""
    data = encode(Image.new("RGB", (12000, 1), (5, 5, 5)), quality=90)
    with pytest.raises(BadInputError, match="decompression bomb"):
        fz.fuse(CropToTensor(224, resize=256)).from_bytes(data)


@pytest.mark.parametrize("kernel", [pytest.param(True, id="resample-kernel"),
                                    pytest.param(False, id="torch", marks=pytest.mark.slow)])
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic"])
def test_eval_resizes_only_the_crop_and_equals_torch_resizing_all_of_it(torch, interpolation, kernel, monkeypatch):
    """Resize + CenterCrop computes only the crop (dsconvert.resample's kernel) or the resize up
    to the crop's far edges (torch): either way the pixels are exactly those of torch resizing
    the whole image, then cropping, on every shape around the common ones (portrait,
    landscape, odd sizes, shrinking and mixed)."""
    from dsconvert import resample

    if kernel and not resample.available(interpolation):
        pytest.skip("dsconvert's resize kernel does not run here")
    if not kernel:
        monkeypatch.setattr(resample, "available", lambda *args: False)
    rng = np.random.default_rng(0)
    shapes = [(375, 500), (500, 375), (427, 640), (257, 301), (300, 260), (1000, 230), (240, 900), (1999, 1501),
              (240, 240), (240, 320), (100, 100), (45, 60), (250, 400)]  # torch would skip an axis as long as its input
    shapes += [tuple(int(v) for v in rng.integers(40, 700, size=2)) for _ in range(60)]
    checked = 0
    for resize, crop in ((256, (224, 224)), (240, (224, 224)), (128, (112, 112)), (120, (80, 80)), (50, (20, 20)),
                         ((50, 120), (40, 80)), ((200, 300), (150, 200)), ((256, 256), (224, 224))):
        g = fz.Geometry("resize", resize=resize, crop=crop, interpolation=interpolation)
        for h, w in shapes:
            pixels = rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)
            target = resized_size(h, w, resize)
            if not fz._crop_only(target, g):
                continue
            full = torch.nn.functional.interpolate(torch.from_numpy(pixels).permute(2, 0, 1)[None], size=target,
                                                   mode=interpolation, antialias=True)[0].permute(1, 2, 0).numpy()
            top, left = int(round((target[0] - crop[0]) / 2.0)), int(round((target[1] - crop[1]) / 2.0))
            assert np.array_equal(fz._resized_centre(pixels, target, crop, interpolation),
                                  full[top:top + crop[0], left:left + crop[1]]), (h, w, resize, crop)
            checked += 1
    assert checked > 300


@pytest.mark.slow
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "lanczos"])
def test_decoding_only_the_rows_above_the_crop_changes_no_pixel(torch, large_jpegs, photos, monkeypatch, interpolation):
    """Without the region extension, libjpeg-turbo stops below the rows the crop reads
    (jpeg_structure.top_rows): train and eval give exactly the pixels of decoding every row, at
    every DCT reduction, in portrait and landscape, and the cut is taken for most random crops."""
    from dsconvert.codecs import jpeg as codecs  # the module whose top_rows the fast decode calls

    pytest.importorskip("turbojpeg")
    monkeypatch.setattr(fz, "region_decode", lambda *args: None)
    portrait = [encode(photos["astronaut"].convert("RGB").resize(size), quality=90)
                for size in ((375, 500), (827, 1203))]
    # a tall, detailed image: Pillow 13 orders its two resize passes by the whole image's shape,
    # so the box's surroundings, not the image, must go to it (found by a review's sweep)
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:4000, 0:2000]
    tall = np.stack([x * 255 // 2000, y * 255 // 4000, (x ^ y) % 256], -1) + rng.integers(-30, 30, (4000, 2000, 3))
    portrait.append(encode(Image.fromarray(tall.clip(0, 255).astype(np.uint8)), quality=90))
    train = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224), interpolation=interpolation),
                              0.0, "uint8", [], None)
    eval_ = fz.FusedTransform(fz.Geometry("resize", resize=256, crop=(224, 224), interpolation=interpolation),
                              0.0, "uint8", [], None)
    cuts = []
    real_cut = codecs.top_rows
    monkeypatch.setattr(codecs, "top_rows", lambda data, rows: cuts.append(rows) or real_cut(data, rows))
    calls = 0
    for t, seeds in ((train, range(6)), (eval_, range(1))):
        for seed in seeds:
            for data in large_jpegs + portrait:
                torch.manual_seed(seed)
                with monkeypatch.context() as m:
                    m.setattr(codecs, "top_rows", lambda data, rows: None)
                    whole = t.from_bytes(data)
                torch.manual_seed(seed)
                assert torch.equal(t.from_bytes(data), whole), (seed, len(data))
                calls += 1
    assert len(cuts) > calls // 2


@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "lanczos"])
def test_decoding_only_the_crops_region_changes_no_pixel(torch, large_jpegs, photos, monkeypatch, interpolation):
    """With the region extension, train decodes only the crop's box and the filter's reach
    around it (rows above and columns beside skip the inverse DCT): the same pixels as decoding
    the whole image, at every DCT reduction, and the region is taken for every JPEG here."""
    from dsconvert import optional
    from dsconvert.codecs import jpeg as codecs  # the module whose top_rows the fast decode calls

    pytest.importorskip("turbojpeg")
    if optional.jpeg_region() is None:
        pytest.skip("dsconvert's region extension is not built here")
    sizes = ((375, 500), (827, 1203), (500, 375), (301, 257))
    images = large_jpegs + [encode(photos["astronaut"].convert("RGB").resize(s), quality=90) for s in sizes]
    train = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224), interpolation=interpolation),
                              0.0, "uint8", [], None)
    eval_ = fz.FusedTransform(fz.Geometry("resize", resize=256, crop=(224, 224), interpolation=interpolation),
                              0.0, "uint8", [], None)
    regions = []
    real = codecs.region_decode
    monkeypatch.setattr(fz, "region_decode", lambda *a: (lambda out: regions.append(out is not None) or out)(real(*a)))
    calls = 0
    for t, seeds in ((train, range(6)), (eval_, range(1))):
        for seed in seeds:
            for data in images:
                torch.manual_seed(seed)
                with monkeypatch.context() as m:
                    m.setattr(fz, "region_decode", lambda *args: None)
                    m.setattr(codecs, "top_rows", lambda data, rows: None)
                    whole = t.from_bytes(data)
                regions.clear()
                torch.manual_seed(seed)
                assert torch.equal(t.from_bytes(data), whole), (seed, len(data))
                assert regions == [True]
                calls += 1
    assert calls == 7 * len(images)


@pytest.mark.parametrize("sample", ["3x1", "4x2", "2x4"])
def test_a_sampling_turbojpeg_cannot_name_decodes_at_the_same_scale_either_way(torch, photos, monkeypatch, sample):
    """PyTurboJPEG 1.x (TurboJPEG 2.x) refuses the header of a 3x1 or 4x2 file that libjpeg
    decodes: without the region extension such a file went to Pillow at full size while the
    extension decoded it at 1/k, so the sample depended on what was installed. Now Pillow's
    draft reduces it as libjpeg-turbo does, on the same pixels (found by a review)."""
    import shutil
    import subprocess

    from dsconvert import optional

    cjpeg = shutil.which("cjpeg")
    if cjpeg is None or optional.jpeg_region() is None:
        pytest.skip("needs cjpeg (libjpeg-turbo-progs) and the region extension")
    ppm = encode(photos["astronaut"].convert("RGB").resize((1401, 1901)), "PPM")  # odd: not a multiple of k
    data = subprocess.run([cjpeg, "-sample", f"{sample},1x1,1x1", "-quality", "90"], input=ppm,
                          capture_output=True, check=True).stdout
    for t, seed in ((fz.fuse(CropToTensor(224, resize=256)), 0), (fz.fuse(RandomResizedCropToTensor(224)), 1)):
        torch.manual_seed(seed)
        with_region = t.from_bytes(data)
        with monkeypatch.context() as m:
            m.setattr(fz, "region_decode", lambda *args: None)
            torch.manual_seed(seed)
            assert torch.equal(t.from_bytes(data), with_region)


def test_a_flip_draws_on_every_sample_as_torchvisions_does(torch, large_jpegs):
    """torchvision's RandomHorizontalFlip draws torch.rand(1) on every call, p = 0 included: the
    fused flip does too (after the box), and a transform without a flip draws nothing more."""
    data = large_jpegs[-1]
    g = fz.Geometry("random_resized_crop", size=(224, 224))
    for flip, draws in ((0.0, 1), (0.5, 1), (1.0, 1), (None, 0)):
        torch.manual_seed(5)
        fz.FusedTransform(g, flip, "uint8", [], None).from_bytes(data)
        after = torch.rand(1)
        torch.manual_seed(5)
        fz.rrc_box(360, 480, g.scale, g.ratio)
        for _ in range(draws):
            torch.rand(1)
        assert torch.equal(after, torch.rand(1)), flip


def test_a_refused_region_decode_draws_the_crop_box_once(torch, large_jpegs):
    """A file the region decode refuses (junk before EOI, read because the box reaches the last
    row) falls back to the other decoders, which ask for the box again: it is drawn once, so
    the random stream, and with it every later sample's crop, is the intact file's."""
    data = large_jpegs[-1]
    junk = data[:-2] + b"\x00" * 7 + b"\xff\xd9"
    t = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224), scale=(1.0, 1.0), ratio=(0.5, 2.0)),
                          0.5, "uint8", [], None)
    after = []
    for sample in (data, junk):
        torch.manual_seed(3)
        out = t.from_bytes(sample)
        after.append((out, torch.rand(4)))
    assert torch.equal(after[0][1], after[1][1])
    assert (after[0][0].double() - after[1][0].double()).abs().mean() < 1.0  # Pillow decodes it alike


@pytest.mark.parametrize("opencv", [True, False])
def test_the_chw_copy_is_numpys_transpose_for_every_layout(monkeypatch, opencv):
    """OpenCV's channel split (the fast copy) and numpy's transpose give the same CHW array,
    flipped or not, from contiguous pixels, a crop of them (rows strided), a view whose
    channels are not interleaved, one channel, and an empty image."""
    if opencv:
        pytest.importorskip("cv2")
    else:
        monkeypatch.setattr(fz, "_cv2", lambda: None)
    rng = np.random.default_rng(3)
    big = rng.integers(0, 256, size=(61, 83, 3), dtype=np.uint8)
    planar = np.ascontiguousarray(big.transpose(2, 0, 1)).transpose(1, 2, 0)  # torch's resize output
    layouts = [big, big[5:40, 7:70], planar, planar[3:50, 9:61], planar[:, :, :2], big[:, :, :1], big[:0],
               big[:, :, ::-1], big[:, ::-1]]
    for pixels in layouts:
        for flip in (False, True):
            out = fz._chw(pixels, flip)
            ref = (pixels[:, ::-1] if flip else pixels).transpose(2, 0, 1)
            assert out.flags.c_contiguous and out.dtype == np.uint8 and np.array_equal(out, ref)


def test_damage_below_the_cut_is_not_seen_and_a_truncation_still_is(torch, large_jpegs, photos, monkeypatch):
    """Junk before EOI (a warning Pillow ignores) under the crop: the cut decode never reads it,
    so the sample is the intact file's; a truncated file is refused wherever the crop falls."""
    from dsconvert.codecs import jpeg as codecs  # the module whose top_rows the fast decode calls

    pytest.importorskip("turbojpeg")
    monkeypatch.setattr(fz, "region_decode", lambda *args: None)
    t = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224)), 0.0, "uint8", [], None)
    data = large_jpegs[0]
    junk = data[:-2] + b"\x00" * 7 + b"\xff\xd9"
    assert pil_full(junk).size == pil_full(data).size  # Pillow decodes it
    cut = []
    real = codecs.top_rows
    monkeypatch.setattr(codecs, "top_rows", lambda d, r: cut.append(real(d, r) is not None) or real(d, r))
    same = 0
    for seed in range(8):
        cut.clear()
        torch.manual_seed(seed)
        damaged = t.from_bytes(junk)
        if cut and cut[0]:
            torch.manual_seed(seed)
            assert torch.equal(damaged, t.from_bytes(data))
            same += 1
    assert same >= 3
    for seed in range(8):  # Pillow's own error, as decode="pil" raises it (the reader names the sample)
        torch.manual_seed(seed)
        with pytest.raises(OSError, match="truncated"):
            t.from_bytes(data[: len(data) * 2 // 3])


# --- how far fused samples may be from torchvision's (README, docs/benchmarks.md) ------------


def _text_page(quality: int) -> bytes:
    from PIL import ImageDraw

    page = Image.new("RGB", (1601, 1203), "white")
    draw = ImageDraw.Draw(page)
    for row in range(0, 1190, 14):
        draw.text((8, row), "The quick brown fox jumps over the lazy dog 0123456789 " * 6, fill="black")
    return encode(page, quality=quality, subsampling=2)


def _worst_distance(transform, data: bytes, seeds: int = 3) -> float:
    import torch

    from dsconvert.codecs import decode_image

    fused = fz.fuse(transform)
    assert fused.fused
    worst = 0.0
    for seed in range(seeds):
        torch.manual_seed(seed)
        a = np.asarray(fused.from_bytes(data), dtype=np.float64)
        torch.manual_seed(seed)
        b = np.asarray(transform(decode_image(data, "pil")), dtype=np.float64)
        worst = max(worst, float(np.abs(a - b).mean()))
    return worst


def test_nearest_is_never_reduced_and_gives_torchvisions_pixels(torch, large_jpegs):
    """A reduced decode replaces single pixels by block averages, which nearest then picks:
    photographs were up to 93 levels off a pixel. Nearest now decodes at full scale."""
    T = pytest.importorskip("torchvision.transforms", reason="torchvision does not import here")
    nearest = T.InterpolationMode.NEAREST
    for transform in (T.Compose([T.RandomResizedCrop(32, interpolation=nearest), T.PILToTensor()]),
                      T.Compose([T.Resize(64, interpolation=nearest), T.CenterCrop(56), T.PILToTensor()])):
        for data in large_jpegs[:2] + [_text_page(75)]:
            assert _worst_distance(transform, data) < 0.01


@pytest.mark.slow
@pytest.mark.parametrize("size", [32, 96])
def test_bilinear_and_bicubic_stay_within_the_stated_bounds(torch, large_jpegs, size):
    """The README's bounds: photographs 0.6 levels, text 3.3 at quality 75 and 8.4 at 5 (where
    a DCT reduction is taken), each with a little room for other decoders' rounding."""
    T = pytest.importorskip("torchvision.transforms", reason="torchvision does not import here")
    for mode in (T.InterpolationMode.BILINEAR, T.InterpolationMode.BICUBIC):
        for transform in (T.Compose([T.RandomResizedCrop(size, interpolation=mode), T.PILToTensor()]),
                          T.Compose([T.Resize(size * 8 // 7, interpolation=mode), T.CenterCrop(size),
                                     T.PILToTensor()])):
            assert max(_worst_distance(transform, d) for d in large_jpegs[:2]) < 0.8
            assert _worst_distance(transform, _text_page(75)) < 3.5
            assert _worst_distance(transform, _text_page(5)) < 9.0
