"""The resize kernel for an output window (dsconvert/_resize.c, dsconvert.resample).

Every pixel it writes must be torch's (F.interpolate(..., antialias=True) on uint8, as
torchvision resizes tensors), for every size, window, filter, channel count and row stride, in
its AVX2 and its plain C loops; it must read only the pixels it is given, and refuse, not
crash, when they do not cover the window or the arguments make no sense."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

from dsconvert import fused as fz, optional, resample

from conftest import can_build_extensions, encode

kernel = optional.resize_kernel()
needs_kernel = pytest.mark.skipif(kernel is None, reason="dsconvert's resize kernel is not built here")
FILTERS = ("bilinear", "bicubic")


def test_the_kernel_is_built_where_it_can_be():
    """Where a compiler and Python's headers are present, the install built it: a silent build
    failure must not leave these tests skipped."""
    if not can_build_extensions():
        pytest.skip("no compiler or headers to build the kernel with")
    assert kernel is not None, "setup.py builds dsconvert._resize; reinstall: pip install -e ."


def torch_resize(torch, pixels: np.ndarray, out_h: int, out_w: int, interpolation: str) -> np.ndarray:
    """torch's own: the reference, CHW."""
    x = torch.from_numpy(np.ascontiguousarray(pixels[:, :, :3])).permute(2, 0, 1)[None]
    return torch.nn.functional.interpolate(x, size=(out_h, out_w), mode=interpolation, antialias=True)[0].numpy()


def run(src, origin, in_shape, out_shape, window, interpolation, planar=True, simd=True) -> np.ndarray:
    """The kernel's window as CHW."""
    top, left, h, w = window
    out = np.empty((3, h, w) if planar else (h, w, 3), np.uint8)
    kernel.window(src, origin[0], origin[1], in_shape[0], in_shape[1], out_shape[0], out_shape[1], top, left, out,
                  resample.FILTERS[interpolation], planar, simd)
    return out if planar else out.transpose(2, 0, 1)


def random_case(rng, max_in=400, max_out=400):
    """An image (3 or 4 channels), a resize of it, a window of the resize, and a src holding
    the pixels the window reads, tightly or with some margin, as a view with a row stride."""
    h, w = (int(v) for v in rng.integers(1, max_in, 2))
    out_h, out_w = (int(v) for v in rng.integers(1, max_out, 2))
    if rng.random() < 0.2:  # one axis unchanged: torch skips that pass
        out_h, out_w = (h, out_w) if rng.random() < 0.5 else (out_h, w)
    channels = int(rng.choice([3, 4]))
    image = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    if rng.random() < 0.3:  # smooth ramps and hard edges, not only noise
        y, x = np.mgrid[0:h, 0:w]
        image[:, :, 0] = (x * 255 // max(w, 1)) ^ ((y // 7) % 2 * 255)
    top, left = int(rng.integers(0, out_h)), int(rng.integers(0, out_w))
    wh, ww = int(rng.integers(1, out_h - top + 1)), int(rng.integers(1, out_w - left + 1))
    return image, (out_h, out_w), (top, left, wh, ww)


def tight_src(image, out_shape, window, interpolation, rng):
    """The part of ``image`` the window reads (span), plus a random margin, and its origin."""
    (h, w), (out_h, out_w), (top, left, wh, ww) = image.shape[:2], out_shape, window
    r0, r1 = resample.span(h, out_h, top, wh, interpolation) if h != out_h else (top, top + wh)
    c0, c1 = resample.span(w, out_w, left, ww, interpolation) if w != out_w else (left, left + ww)
    m = [int(v) for v in rng.integers(0, 3, 4)] if rng.random() < 0.5 else [0, 0, 0, 0]
    r0, c0 = max(0, r0 - m[0]), max(0, c0 - m[1])
    r1, c1 = min(h, r1 + m[2]), min(w, c1 + m[3])
    return image[r0:r1, c0:c1], (r0, c0)


@needs_kernel
@pytest.mark.parametrize("simd", [True, False], ids=["avx2", "plain-c"])
@pytest.mark.parametrize("interpolation", FILTERS)
def test_every_window_is_torchs_pixels(torch, interpolation, simd):
    if simd and not kernel.simd():
        pytest.skip("this CPU has no AVX2: the kernel's AVX2 loops do not run here")
    """400 random images, resizes (shrinking, enlarging, mixed, one axis unchanged) and windows,
    from tight views of the pixels they read: every pixel equals torch's resize of the whole
    image, planar or interleaved."""
    rng = np.random.default_rng(1 + simd + 2 * FILTERS.index(interpolation))
    for case in range(400):
        image, out_shape, window = random_case(rng)
        src, origin = tight_src(image, out_shape, window, interpolation, rng)
        top, left, h, w = window
        want = torch_resize(torch, image, *out_shape, interpolation)[:, top:top + h, left:left + w]
        got = run(src, origin, image.shape[:2], out_shape, window, interpolation, planar=case % 2 == 0, simd=simd)
        assert np.array_equal(got, want), (case, image.shape, out_shape, window)


@needs_kernel
@pytest.mark.parametrize("interpolation", FILTERS)
def test_large_reductions_and_thin_images_are_torchs_pixels(torch, interpolation):
    """Wide filters (a 2000-pixel side to 20: 200 taps an output), 1-pixel sides, and a window
    of one pixel."""
    rng = np.random.default_rng(7)
    cases = [((2000, 1500), (20, 224)), ((1, 2000), (1, 50)), ((2000, 1), (224, 3)), ((1, 1), (224, 224)),
             ((3, 900), (300, 2)), ((1200, 1600), (256, 341))]
    for (h, w), out_shape in cases:
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        want = torch_resize(torch, image, *out_shape, interpolation)
        for simd in (True, False):
            assert np.array_equal(run(image, (0, 0), (h, w), out_shape, (0, 0, *out_shape), interpolation, simd=simd),
                                  want), ((h, w), out_shape, simd)
        y, x = out_shape[0] // 2, out_shape[1] // 2
        assert np.array_equal(run(image, (0, 0), (h, w), out_shape, (y, x, 1, 1), interpolation),
                              want[:, y:y + 1, x:x + 1])


@needs_kernel
@pytest.mark.parametrize("simd", [True, False], ids=["avx2", "plain-c"])
@pytest.mark.parametrize("interpolation", FILTERS)
def test_a_flipped_window_is_torchs_pixels_mirrored(torch, interpolation, simd):
    """flip=True (a RandomHorizontalFlip written by the kernel, no copy): 300 random cases,
    the columns unchanged included (the pass that only copies), planar and interleaved, into a
    given array; every pixel equals torch's resize of the whole image, mirrored."""
    if simd and not kernel.simd():
        pytest.skip("this CPU has no AVX2: the kernel's AVX2 loops do not run here")
    rng = np.random.default_rng(11 + simd + 2 * FILTERS.index(interpolation))
    for case in range(300):
        image, out_shape, window = random_case(rng)
        src, origin = tight_src(image, out_shape, window, interpolation, rng)
        top, left, h, w = window
        want = torch_resize(torch, image, *out_shape, interpolation)[:, top:top + h, left:left + w][:, :, ::-1]
        planar = case % 2 == 0
        out = np.full((3, h, w) if planar else (h, w, 3), 7, np.uint8)
        got = resample.resize_window(src, origin, image.shape[:2], out_shape, window, interpolation, planar, simd,
                                     flip=True, out=out)
        assert np.shares_memory(got, out)
        assert np.array_equal(got.transpose(2, 0, 1), want), (case, image.shape, out_shape, window)
    with pytest.raises(ValueError, match="out is"):
        resample.resize_window(image, (0, 0), image.shape[:2], (8, 8), (0, 0, 8, 8), interpolation,
                               out=np.empty((3, 8, 9), np.uint8))


@needs_kernel
def test_a_missing_input_pixel_is_refused():
    """src one row or column short of what the window reads, on each side: ValueError, saying
    what it holds and what the window reads."""
    image = np.random.default_rng(0).integers(0, 256, (375, 500, 3), dtype=np.uint8)
    window = (16, 58, 224, 224)
    r0, r1 = resample.span(375, 256, 16, 224, "bilinear")
    c0, c1 = resample.span(500, 341, 58, 224, "bilinear")
    assert run(image[r0:r1, c0:c1], (r0, c0), (375, 500), (256, 341), window, "bilinear").shape == (3, 224, 224)
    for src, origin in ((image[r0 + 1:r1, c0:c1], (r0 + 1, c0)), (image[r0:r1 - 1, c0:c1], (r0, c0)),
                        (image[r0:r1, c0 + 1:c1], (r0, c0 + 1)), (image[r0:r1, c0:c1 - 1], (r0, c0)),
                        (image[r0:r1, c0:c1], (r0 + 1, c0)), (image[r0:r1, c0:c1], (r0, c0 - 1))):
        with pytest.raises(ValueError, match="the window reads"):
            run(src, origin, (375, 500), (256, 341), window, "bilinear")


@needs_kernel
def test_nonsense_arguments_raise_and_never_crash():
    """Every argument the kernel checks, wrong: an exception, not a crash or a write out of
    bounds."""
    img = np.zeros((10, 10, 3), np.uint8)
    out = np.zeros((3, 5, 5), np.uint8)

    def call(src=img, origin=(0, 0), in_shape=(10, 10), out_shape=(5, 5), top=0, left=0, dst=out, f=0, planar=True):
        kernel.window(src, origin[0], origin[1], in_shape[0], in_shape[1], out_shape[0], out_shape[1], top, left,
                      dst, f, planar, True)

    call()
    bad = [dict(src=img.astype(np.float32)), dict(src=img[:, :, 0]), dict(src=np.zeros((10, 10, 5), np.uint8)),
           dict(src=img[:, ::2]), dict(src=img[::-1]), dict(src=np.zeros((0, 10, 3), np.uint8)),
           dict(dst=np.zeros((3, 5, 5), np.int16)), dict(dst=np.zeros((5, 5, 3), np.uint8)),
           dict(dst=np.zeros((3, 5, 5), np.uint8)[:, ::2]), dict(dst=np.zeros(75, np.uint8)),
           dict(dst=bytes(75)), dict(top=1), dict(left=-1), dict(out_shape=(0, 5)), dict(in_shape=(0, 10)),
           dict(in_shape=(10, 1 << 30)), dict(out_shape=(1 << 40, 5)), dict(f=7), dict(f=-1),
           dict(dst=np.zeros((3, 0, 5), np.uint8)), dict(origin=(1, 0)), dict(origin=(-(1 << 62), 0)),
           dict(src=b"\x00" * 300), dict(top=2 ** 63 - 1), dict(left=2 ** 63 - 1),
           dict(out_shape=(10, 10), top=2 ** 63 - 1), dict(in_shape=(10, 10), out_shape=(10, 10), left=2 ** 63 - 2),
           dict(origin=(2 ** 62, 0)), dict(origin=(0, -(2 ** 63))), dict(in_shape=(1 << 24, 10))]
    for kwargs in bad:
        with pytest.raises((ValueError, TypeError, BufferError, OverflowError)):
            call(**kwargs)
    for args in ((0, 5, 0, 5, 0), (10, 5, 0, 6, 0), (10, 5, 0, 5, 2), (1 << 40, 5, 0, 5, 0), (10, 5, -1, 5, 0),
                 (4, 2, 2 ** 63 - 1, 1, 0), (4, 2, 1, 2 ** 63 - 1, 0)):
        with pytest.raises((ValueError, OverflowError)):
            kernel.span(*args)


@needs_kernel
def test_the_kernel_releases_the_gil():
    """A Python thread runs while a resize runs. The switch interval is raised far above a
    resize's length, so the interpreter never takes the GIL from its holder: a thread waiting
    for it gets it only when the holder lets it go, as the kernel does around its loops. The
    spinner lets it go at each turn (a sleep), so the main thread always takes it back at once.
    Held through the kernel, the count could not move at all: this needs no timing."""
    import sys
    import time

    image = np.random.default_rng(0).integers(0, 256, (1000, 1000, 3), dtype=np.uint8)
    out = np.empty((3, 900, 900), np.uint8)
    count, stop, started = [0], [], threading.Event()

    def spin():
        started.set()
        while not stop:
            count[0] += 1
            time.sleep(0)  # the GIL released each turn

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    spinner = threading.Thread(target=spin)
    try:
        spinner.start()
        started.wait()
        during = 0
        for _ in range(100):  # one resize is enough where the spinner gets a core during it
            start = count[0]
            kernel.window(image, 0, 0, 1000, 1000, 900, 900, 0, 0, out, 1, True, False)
            during = count[0] - start
            if during:
                break
    finally:
        stop.append(True)
        spinner.join()
        sys.setswitchinterval(interval)
    assert during > 0


@needs_kernel
def test_threads_share_the_kernel(torch):
    """Eight threads at once get the same pixels as one."""
    rng = np.random.default_rng(3)
    cases = [random_case(rng) for _ in range(24)]
    want = [run(image, (0, 0), image.shape[:2], out_shape, window, "bilinear") for image, out_shape, window in cases]
    failures = []

    def worker():
        for _ in range(20):
            for (image, out_shape, window), expected in zip(cases, want):
                if not np.array_equal(run(image, (0, 0), image.shape[:2], out_shape, window, "bilinear"), expected):
                    failures.append(window)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


needs_simd = pytest.mark.skipif(not resample.available("bilinear"),
                                reason="dsconvert's resize kernel does not run here (not built, or no AVX2)")


@needs_simd
@pytest.mark.parametrize("output", ["uint8", "pil"])
def test_fused_transforms_give_the_same_samples_with_and_without_the_kernel(torch, photos, monkeypatch, output):
    """Train (RandomResizedCrop) and eval (Resize + CenterCrop) from JPEGs and from decoded
    pixels, shrinking and enlarging: torch gives the same samples and random draws."""
    sizes = ((375, 500), (500, 375), (301, 257), (1203, 827), (180, 240))
    images = [encode(photos["astronaut"].convert("RGB").resize(s), quality=90) for s in sizes]
    for interpolation in FILTERS:
        train = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224), interpolation=interpolation),
                                  0.5, output, [], None)
        eval_ = fz.FusedTransform(fz.Geometry("resize", resize=256, crop=(224, 224), interpolation=interpolation),
                                  None, output, [], None)
        for t in (train, eval_):
            for seed, data in enumerate(images):
                pixels = np.asarray(photos["coffee"].convert("RGB").resize((sizes[seed][1], sizes[seed][0])))
                got = []
                for on in (True, False):
                    with monkeypatch.context() as m:
                        if not on:
                            m.setattr(resample, "available", lambda *args: False)
                        torch.manual_seed(seed)
                        got.append((np.asarray(t.from_bytes(data)), np.asarray(t.from_pixels(pixels)),
                                    torch.rand(1).item()))
                assert all(np.array_equal(a, b) for a, b in zip(got[0][:2], got[1][:2])), (interpolation, seed)
                assert got[0][2] == got[1][2]


@needs_simd
def test_pixels_the_kernel_does_not_take_go_to_torch(torch, monkeypatch):
    """Decoded outputs may hold 1, 2 or 4 channels, or arrays laid out otherwise (a CHW array
    seen as HWC, Fortran order, every other column): torch resizes them, as it did before the
    kernel, keeping their channels; sides past the kernel's limit go to torch too."""
    rng = np.random.default_rng(5)
    base = rng.integers(0, 256, (300, 400, 4), dtype=np.uint8)
    arrays = [base, base[:, :, :1], base[:, :, :2], base[:, :, :3], np.asfortranarray(base[:, :, :3]),
              np.ascontiguousarray(base[:, :, :3].transpose(2, 0, 1)).transpose(1, 2, 0),
              np.ascontiguousarray(base[:, ::2, :3]), base[:, ::2, :3]]
    for interpolation in FILTERS:
        train = fz.FusedTransform(fz.Geometry("random_resized_crop", size=(224, 224), interpolation=interpolation),
                                  None, "uint8", [], None)
        eval_ = fz.FusedTransform(fz.Geometry("resize", resize=256, crop=(224, 224), interpolation=interpolation),
                                  None, "uint8", [], None)
        for t in (train, eval_):
            for pixels in arrays:
                got = []
                for on in (True, False):
                    with monkeypatch.context() as m:
                        if not on:
                            m.setattr(resample, "available", lambda *args: False)
                        torch.manual_seed(0)
                        got.append(t.from_pixels(pixels))
                assert got[0].shape == (pixels.shape[2], 224, 224) and torch.equal(got[0], got[1]), pixels.strides
    assert not resample.available("bilinear", (1, resample.SIDE_LIMIT), (1, 8))
    assert not resample.available("bilinear", (300, 400), (0, 8))
    assert resample.available("bilinear", (300, 400), (1, 8), np.ascontiguousarray(base[:, :, :3]))


@needs_kernel
@pytest.mark.parametrize("interpolation", FILTERS)
def test_a_box_inside_larger_pixels_is_torchs_resize_of_the_box(torch, interpolation):
    """RandomResizedCrop's box read in place from the decoded pixels around it (an origin before
    the box's corner, as fused train passes it): torch's resize of the box alone."""
    rng = np.random.default_rng(11)
    for _ in range(150):
        h, w = (int(v) for v in rng.integers(2, 300, 2))
        image = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        top, left = int(rng.integers(0, h - 1)), int(rng.integers(0, w - 1))
        bh, bw = int(rng.integers(1, h - top + 1)), int(rng.integers(1, w - left + 1))
        out = tuple(int(v) for v in rng.integers(1, 300, 2))
        want = torch_resize(torch, image[top:top + bh, left:left + bw], *out, interpolation)
        assert np.array_equal(run(image, (-top, -left), (bh, bw), out, (0, 0, *out), interpolation), want)


def guarded(h: int, w: int, channels: int, stride: int, at_start: bool, rng) -> np.ndarray:
    """An (h, w, channels) uint8 array with row ``stride``, ending just before an unreadable page
    (or starting just after one): any read past its bytes is a segfault."""
    import ctypes
    import mmap

    nbytes = (h - 1) * stride + w * channels
    pages = -(-nbytes // mmap.PAGESIZE) + 2
    m = mmap.mmap(-1, pages * mmap.PAGESIZE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    mprotect = ctypes.CDLL(None).mprotect
    mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    guard = base if at_start else base + (pages - 1) * mmap.PAGESIZE
    assert mprotect(guard, mmap.PAGESIZE, 0) == 0
    offset = mmap.PAGESIZE if at_start else (pages - 1) * mmap.PAGESIZE - nbytes
    flat = np.frombuffer(m, np.uint8, count=nbytes, offset=offset)
    flat[:] = rng.integers(0, 256, nbytes, dtype=np.uint8)
    return np.lib.stride_tricks.as_strided(flat, (h, w, channels), (stride, channels, 1))


@pytest.mark.slow
@needs_kernel
@pytest.mark.skipif(not hasattr(os, "fork") or os.uname().sysname != "Linux", reason="mprotect through ctypes: Linux")
def test_the_kernel_reads_nothing_past_its_source():
    """Sources that end at an unreadable page, or start after one (3 and 4 channels, padded rows,
    both filters, both loops, planar and interleaved): no fault, and torch's pixels. Run in a
    child process, so that a fault fails the test instead of the run."""
    import subprocess
    import sys

    code = f"""
import sys
sys.path[:0] = {[os.path.dirname(__file__)]!r}
import numpy as np, torch
from test_resample import guarded, run, torch_resize
rng = np.random.default_rng(0)
for case in range(300):
    h, w, channels = int(rng.integers(1, 60)), int(rng.integers(1, 60)), int(rng.choice([3, 4]))
    stride = w * channels + (int(rng.integers(0, 5)) if rng.random() < 0.5 else 0)
    image = guarded(h, w, channels, stride, rng.random() < 0.3, rng)
    out = (int(rng.integers(1, 80)), int(rng.integers(1, 80)))
    for interpolation in ("bilinear", "bicubic"):
        want = torch_resize(torch, image, *out, interpolation)
        for simd in (True, False):
            got = run(image, (0, 0), (h, w), out, (0, 0, *out), interpolation, planar=simd, simd=simd)
            assert np.array_equal(got, want), (case, h, w, channels, out, interpolation, simd)
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-2000:])
