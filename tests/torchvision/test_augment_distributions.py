"""gpufeed's augmentations draw their parameters from the distributions torchvision and timm draw
them from: two-sample Kolmogorov-Smirnov tests for continuous parameters and chi-square tests for
categories (op choice, magnitude bins, signs, interpolation, whether an op applies), at 0.001,
over a few thousand draws from fixed seeds on both sides. Needs torchvision and timm (.venv-tv)."""

from __future__ import annotations

import random

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
timm_aa = pytest.importorskip("timm.data.auto_augment", reason="timm is not installed (tvtest extra)")

import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.autoaugment as tv_aa  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import random_erasing as timm_re  # noqa: E402

from gpufeed.image import augment as A  # noqa: E402
from gpufeed.image.augment._policies import augmentation_space  # noqa: E402
from tests.torchvision._augment import run_container  # noqa: E402
from tests.torchvision._stats import assert_same_categories, assert_same_continuous  # noqa: E402

pytestmark = pytest.mark.timeout(120)
N = 2000
H, W = 32, 40
_PIL = Image.new("RGB", (W, H))


def ours(op, n: int = N, seed: int = 11) -> list:
    return [op.draw(A.row_rng(seed, 0, i), H, W) for i in range(n)]


def recorded_policy(policy, monkeypatch, n: int = N) -> list:
    """torchvision's draws: the (op, magnitude) pairs its forward passes to _apply_op."""
    calls: list = []
    current: list = []

    def record(img, op_name, magnitude, interpolation, fill):
        current.append((op_name, float(magnitude)))
        return img

    monkeypatch.setattr(tv_aa, "_apply_op", record)
    torch.manual_seed(0)
    for _ in range(n):
        current = []
        policy(_PIL)
        calls.append(tuple(current))
    return calls


def _bin(policy: str, op: str, magnitude: float, bins: int) -> int:
    magnitudes = augmentation_space(policy, bins, H, W)[op]
    if magnitudes is None:
        return -1
    return int(np.argmin(np.abs(np.abs(magnitudes.astype(float)) - abs(magnitude))))


def test_trivial_augment_wide(monkeypatch):
    theirs = [p[0] for p in recorded_policy(tv_aa.TrivialAugmentWide(), monkeypatch)]
    mine = [p[0] for p in ours(A.TrivialAugmentWide())]
    assert_same_categories([op for op, _ in mine], [op for op, _ in theirs], "op")
    assert_same_categories([_bin("wide", op, m, 31) for op, m in mine if op != "Identity"],
                           [_bin("wide", op, m, 31) for op, m in theirs if op != "Identity"],
                           "magnitude bin")
    assert_same_categories([(op, m < 0) for op, m in mine if m != 0],
                           [(op, m < 0) for op, m in theirs if m != 0], "op and sign")


def test_rand_augment(monkeypatch):
    theirs = recorded_policy(tv_aa.RandAugment(2, 9), monkeypatch)
    mine = ours(A.RandAugment(2, 9))
    assert {len(p) for p in mine} == {len(p) for p in theirs} == {2}
    for layer in (0, 1):
        assert_same_categories([p[layer][0] for p in mine], [p[layer][0] for p in theirs],
                               f"op of layer {layer}")
    assert_same_categories([(op, m < 0) for p in mine for op, m in p],
                           [(op, m < 0) for p in theirs for op, m in p], "op and sign")
    # the magnitude of each op is bin 9 of torchvision's table, to the float32 value
    assert {(op, abs(m)) for p in mine for op, m in p} == {(op, abs(m)) for p in theirs for op, m in p}


def test_auto_augment_imagenet(monkeypatch):
    theirs = recorded_policy(tv_aa.AutoAugment(tv_aa.AutoAugmentPolicy.IMAGENET), monkeypatch)
    mine = ours(A.AutoAugment())
    assert_same_categories(mine, theirs, "applied ops (op, signed magnitude) sequence")


def test_color_jitter():
    jitter = T.ColorJitter(0.4, 0.4, 0.4, 0.1)
    torch.manual_seed(0)
    theirs = [T.ColorJitter.get_params(jitter.brightness, jitter.contrast, jitter.saturation,
                                       jitter.hue) for _ in range(N)]
    mine = ours(A.ColorJitter(0.4, 0.4, 0.4, 0.1))
    assert_same_categories([tuple(i for i, _ in p) for p in mine],
                           [tuple(int(i) for i in t[0]) for t in theirs], "order")
    for k, which in enumerate(("brightness", "contrast", "saturation", "hue")):
        assert_same_continuous([dict(p)[k] for p in mine], [t[1 + k] for t in theirs], which)


def test_gaussian_blur_and_rotation():
    torch.manual_seed(0)
    sigmas = [T.GaussianBlur.get_params(0.1, 2.0) for _ in range(N)]
    assert_same_continuous(ours(A.GaussianBlur(5, (0.1, 2.0))), sigmas, "sigma")
    angles = [T.RandomRotation.get_params([-30.0, 30.0]) for _ in range(N)]
    assert_same_continuous(ours(A.RandomRotation(30)), angles, "angle")


def test_affine():
    torch.manual_seed(0)
    theirs = [T.RandomAffine.get_params([-30.0, 30.0], [0.2, 0.1], [0.7, 1.3], [-15.0, 15.0, -5.0, 5.0],
                                        [W, H]) for _ in range(N)]
    mine = ours(A.RandomAffine(30, (0.2, 0.1), (0.7, 1.3), (-15, 15, -5, 5)))
    for k, which in enumerate(("angle", "dx", "dy", "scale", "shear x", "shear y")):
        flat = [lambda p: p[0], lambda p: p[1][0], lambda p: p[1][1], lambda p: p[2],
                lambda p: p[3][0], lambda p: p[3][1]][k]
        a, b = [flat(p) for p in mine], [flat(p) for p in theirs]
        if which in ("dx", "dy"):
            assert_same_categories(a, b, which)
        else:
            assert_same_continuous(a, b, which)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_probabilities(p):
    """Flips, grayscale and the single ops apply with torchvision's probability."""
    torch.manual_seed(0)
    img = torch.arange(2, dtype=torch.uint8).view(1, 1, 2)
    theirs = [bool(T.RandomHorizontalFlip(p)(img)[0, 0, 0] == 1) for _ in range(N)]
    for op in (A.RandomHorizontalFlip(p), A.RandomVerticalFlip(p), A.RandomGrayscale(p),
               A.RandomInvert(p), A.RandomEqualize(p), A.RandomSolarize(128, p)):
        assert_same_categories([d is not None for d in ours(op)], theirs, op.name)


def _boxes(params) -> list:
    return [box[:4] for box in params]


def test_random_erasing():
    img = torch.zeros(3, H, W)
    torch.manual_seed(0)
    theirs = [T.RandomErasing.get_params(img, (0.02, 0.33), (0.3, 3.3), [0.0])[:4]
              for _ in range(N)]
    theirs = [t for t in theirs if t[2] < H]  # no box in 10 tries: (0, 0, H, W)
    mine = [b for p in ours(A.RandomErasing(1.0)) for b in _boxes(p)]
    for k, which in enumerate(("top", "left", "height", "width")):
        assert_same_continuous([b[k] for b in mine], [t[k] for t in theirs], which)
    applied = [bool((T.RandomErasing(0.3, value=1)(img) != 0).any()) for _ in range(N)]
    assert_same_categories([bool(p) for p in ours(A.RandomErasing(0.3))], applied, "applied")


def test_timm_random_erasing():
    random.seed(0)
    op = timm_re.RandomErasing(0.4, mode="const", device="cpu")
    theirs, applied = [], []
    for _ in range(N // 2):  # timm's op on a tensor costs ~1 ms a call
        img = torch.ones(3, H, W)
        op(img)
        zero = (img[0] == 0).nonzero()
        applied.append(len(zero) > 0)
        if len(zero):
            (t, le), (b, r) = zero.min(0).values.tolist(), zero.max(0).values.tolist()
            theirs.append((t, le, b - t + 1, r - le + 1))
    draws = ours(A.TimmRandomErasing(0.4), N // 2)
    assert_same_categories([bool(p) for p in draws], applied, "applied")
    mine = [b for p in draws for b in _boxes(p)]
    for k, which in enumerate(("top", "left", "height", "width")):
        assert_same_continuous([b[k] for b in mine], [t[k] for t in theirs], which)


def record_into(ops: list, current: list) -> None:
    """Make each timm op's aug_fn append what it receives to ``current`` (its name, level args and
    the interpolation it would choose, drawn as timm's _check_args_tf draws it; for
    GaussianBlurRand, the radius its op draws, as timm's gaussian_blur_rand draws it) and return
    the image unchanged."""
    for op in ops:
        def record(img, *args, _name=op.name, **kwargs):
            interp = "random"
            if _name in ("Rotate", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"):
                interp = {2: "bilinear", 3: "bicubic"}[int(timm_aa._interpolation(kwargs))]
            if _name == "GaussianBlurRand":
                args = (random.uniform(0.1, 2.0 * args[0]),)
            current.append((_name, tuple(args), interp))
            return img
        op.aug_fn = record


def recorded_timm(config: str, n: int = N) -> list:
    """timm's draws: what each applied op's aug_fn receives (its level args; the interpolation
    it would choose, drawn as timm's _check_args_tf draws it)."""
    ra = timm_aa.rand_augment_transform(config, {"translate_const": 100, "img_mean": (124, 116, 104)})
    calls: list = []
    current: list = []
    record_into(ra.ops, current)
    random.seed(0)
    np.random.seed(0)
    for _ in range(n):
        current.clear()
        ra(_PIL)
        calls.append(tuple(current))
    return calls


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m9-n3-mstd0", "rand-m6-mstd101",
                                    "rand-m9-mstd0.5-t3a", "rand-m9-mstd0.5-inc1-t3aw",
                                    "rand-m9-n3-tweights"])
def test_timm_rand_augment(config):
    theirs = recorded_timm(config)
    mine = ours(A.TimmRandAugment.from_config(config, fill=(124, 116, 104), translate_const=100))
    assert_same_categories([len(p) for p in mine], [len(p) for p in theirs], "ops applied")
    flat_m = [c for p in mine for c in p]
    flat_t = [c for p in theirs for c in p]
    assert_same_categories([c[0] for c in flat_m], [c[0] for c in flat_t], "op")
    assert_same_categories([c[2] for c in flat_m], [c[2] for c in flat_t], "interpolation")
    for name in ("Rotate", "ShearX", "TranslateXRel", "ColorIncreasing", "Color", "Desaturate",
                 "GaussianBlur"):
        a = [c[1][0] for c in flat_m if c[0] == name]
        b = [c[1][0] for c in flat_t if c[0] == name]
        if a or b:
            assert_same_continuous(a, b, f"{name} argument")
    for name in ("PosterizeIncreasing", "SolarizeIncreasing", "SolarizeAdd", "Posterize"):
        a = [c[1][0] for c in flat_m if c[0] == name]
        b = [c[1][0] for c in flat_t if c[0] == name]
        if a or b:
            assert_same_categories(a, b, f"{name} argument")


class _Tagged(list):
    """A timm sub-policy that records its index when timm's AutoAugment runs it."""

    def __init__(self, ops, index, seen):
        super().__init__(ops)
        self.index, self.seen = index, seen

    def __iter__(self):
        self.seen.append(self.index)
        return super().__iter__()


def recorded_timm_auto(config: str, n: int = N) -> tuple[list, list]:
    """timm's AutoAugment draws: the sub-policy it picks, and what each applied op's aug_fn
    receives (as :func:`recorded_timm`)."""
    aa = timm_aa.auto_augment_transform(config, {"translate_const": 100, "img_mean": (124, 116, 104)})
    chosen: list = []
    calls: list = []
    current: list = []
    record_into([op for sub in aa.policy for op in sub], current)
    aa.policy = [_Tagged(sub, i, chosen) for i, sub in enumerate(aa.policy)]
    random.seed(0)
    for _ in range(n):
        current.clear()
        aa(_PIL)
        calls.append(tuple(current))
    return chosen, calls


@pytest.mark.parametrize("config", ["original-mstd0.5", "v0r", "v0-mstd1", "3a", "3a-mstd1"])
def test_timm_auto_augment(config):
    chosen, theirs = recorded_timm_auto(config)
    op = A.TimmAutoAugment.from_config(config, fill=(124, 116, 104), translate_const=100)
    # the sub-policy: the first draw of each row (what draw() picks first, read back the same way)
    mine_chosen = [int(A.row_rng(11, 0, i).integers(len(op.policy))) for i in range(N)]
    assert_same_categories(mine_chosen, chosen, "sub-policy")
    mine = ours(op)
    assert_same_categories([tuple(c[0] for c in p) for p in mine],
                           [tuple(c[0] for c in p) for p in theirs], "ops applied")
    flat_m = [c for p in mine for c in p]
    flat_t = [c for p in theirs for c in p]
    assert_same_categories([c[2] for c in flat_m], [c[2] for c in flat_t], "interpolation")
    for name in ("Rotate", "ShearX", "ShearY", "Color", "Contrast", "TranslateYRel", "Desaturate",
                 "GaussianBlurRand"):
        a = [c[1][0] for c in flat_m if c[0] == name]
        b = [c[1][0] for c in flat_t if c[0] == name]
        if a or b:
            assert_same_continuous(a, b, f"{name} argument")
    for name in ("PosterizeOriginal", "PosterizeIncreasing", "Posterize", "Solarize", "SolarizeAdd"):
        a = [c[1][0] for c in flat_m if c[0] == name]
        b = [c[1][0] for c in flat_t if c[0] == name]
        if a or b:
            assert_same_categories(a, b, f"{name} argument")


def _run_container(make, k: int) -> list:
    return run_container(make, k, N)


def test_containers_choose_as_torchvision():
    ops = (A.RandomInvert(1.0), A.RandomEqualize(1.0), A.RandomGrayscale(1.0))
    weights = [1, 2, 3]
    for theirs_make, mine in (
            (lambda m: T.RandomChoice(m, p=weights), A.RandomChoice(ops, weights)),
            (lambda m: V.RandomChoice(m, p=weights), A.RandomChoice(ops, weights)),
            (lambda m: T.RandomChoice(m), A.RandomChoice(ops))):
        theirs = [t[0] for t in _run_container(theirs_make, 3)]
        assert_same_categories([p[0] for p in ours(mine)], theirs, "choice")
    for theirs_make in (T.RandomOrder, V.RandomOrder):
        theirs = _run_container(theirs_make, 3)
        mine = [tuple(i for i, _ in p) for p in ours(A.RandomOrder(ops))]
        assert_same_categories(mine, theirs, "order")
    for theirs_make in (lambda m: T.RandomApply(m, p=0.3),
                        lambda m: V.RandomApply(m, p=0.3)):
        theirs = [bool(t) for t in _run_container(theirs_make, 2)]
        assert_same_categories([p is not None for p in ours(A.RandomApply(ops[:2], 0.3))], theirs,
                               "applied")


def test_a_container_draws_its_ops_parameters_and_apply_draws_nothing():
    op = A.RandomApply((A.RandomInvert(0.5), A.RandomRotation(30)), 0.7)
    draws = ours(op)
    applied = [p for p in draws if p is not None]
    assert_same_categories([p[0] is not None for p in applied],
                           [bool(b) for b in np.random.default_rng(3).random(len(applied)) < 0.5],
                           "inner applied")
    assert_same_continuous([p[1] for p in applied],
                           list(np.random.default_rng(3).uniform(-30, 30, len(applied))), "angle")
    row = np.random.default_rng(0).integers(0, 256, (H, W, 3), dtype=np.uint8)
    params = next(p for p in draws if p is not None)
    assert np.array_equal(op.apply(row.copy(), params), op.apply(row.copy(), params))
