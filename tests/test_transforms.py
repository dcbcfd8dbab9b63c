"""Reference transforms: the shapes they give, torchvision's crop-box rules, and loading a
user's own transform by name."""

import math
import random
import sys

import numpy as np
import pytest
from PIL import Image

from dsconvert.errors import OptionError
from dsconvert.transforms import CropToTensor, RandomResizedCropToTensor, load_transform


def test_eval_is_resize_256_then_centre_crop_224(torch):
    t = load_transform("eval")
    assert isinstance(t, CropToTensor) and (t.resize, t.size) == (256, 224)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (300, 500, 3), dtype=np.uint8))
    out = t(img)
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8
    # the same pixels as torchvision's rules by hand: Resize(256) truncates the longer side
    # (int(256 * 500 / 300) = 426), CenterCrop rounds the offsets
    ref = img.resize((int(256 * 500 / 300), 256), Image.Resampling.BILINEAR)
    left, top = int(round((ref.width - 224) / 2.0)), int(round((ref.height - 224) / 2.0))
    expect = np.asarray(ref.crop((left, top, left + 224, top + 224))).transpose(2, 0, 1)
    assert np.array_equal(out.numpy(), expect)
    out[0, 0, 0] = 1  # a writable tensor
    gray = t(np.zeros((40, 30), dtype=np.uint8))
    assert gray.shape == (1, 224, 224)


def test_random_resized_crop_boxes_follow_torchvision(torch):
    t = RandomResizedCropToTensor(224)
    rng = random.Random(0)
    w, h = 640, 480
    areas, ratios = [], []
    for _ in range(4000):
        top, left, bh, bw = t.box(w, h, rng)
        assert 0 <= top and top + bh <= h and 0 <= left and left + bw <= w and bh > 0 and bw > 0
        areas.append(bh * bw / (w * h))
        ratios.append(bw / bh)
    # area uniform in (0.08, 1), log aspect ratio uniform in (log 3/4, log 4/3), the first of ten
    # tries that fits: the same rule drawn independently, vectorised with numpy
    g = np.random.default_rng(1)
    a = g.uniform(0.08, 1.0, (20000, 10)) * w * h
    r = np.exp(g.uniform(math.log(3 / 4), math.log(4 / 3), (20000, 10)))
    bw_, bh_ = np.round(np.sqrt(a * r)), np.round(np.sqrt(a / r))
    ok = (bw_ <= w) & (bh_ <= h)
    first = ok.argmax(axis=1)
    pick = np.arange(20000)
    ref = (bw_[pick, first] * bh_[pick, first] / (w * h))[ok.any(axis=1)]
    assert min(areas) >= 0.075 and max(areas) <= 1.0
    assert abs(float(np.median(areas)) - float(np.median(ref))) < 0.03
    assert abs(float(np.mean(areas)) - float(np.mean(ref))) < 0.02
    logs = np.log(ratios)
    assert math.log(3 / 4) - 0.02 <= logs.min() and logs.max() <= math.log(4 / 3) + 0.02
    ref_logs = np.log(bw_[pick, first] / bh_[pick, first])[ok.any(axis=1)]
    assert abs(float(np.median(logs)) - float(np.median(ref_logs))) < 0.02
    # a strip no box fits in: torchvision's fallback, the centre crop clamped to the ratio range
    assert t.box(1000, 10, rng) == (0, (1000 - round(10 * 4 / 3)) // 2, 10, round(10 * 4 / 3))
    out = t(Image.new("RGB", (640, 480)))
    assert out.shape == (3, 224, 224) and out.dtype == torch.uint8


def test_user_transform_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_aug.py").write_text(
        "def shrink(img):\n    return img.resize((8, 8))\n\n"
        "class Half:\n    def __call__(self, img):\n        return img.reduce(2)\n\nNOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_transform("my_aug:shrink")(Image.new("RGB", (20, 20))).size == (8, 8)
    assert load_transform("my_aug:Half")(Image.new("RGB", (20, 20))).size == (10, 10)
    assert load_transform("none") is None and load_transform(None) is None
    for bad, match in (("my_aug:NOT_CALLABLE", "not callable"), ("my_aug:missing", "cannot load"),
                       ("no_such_module_x:f", "cannot load"), ("nonsense", "module:callable"),
                       (":f", "module:callable")):
        with pytest.raises(OptionError, match=match):
            load_transform(bad)
    sys.modules.pop("my_aug", None)
