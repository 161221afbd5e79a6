"""gpufeed's AugMix against torchvision's ``AugMix`` (v1, v2) and timm's ``AugMixAugment``:
with the random draws fixed (one chain of one op, given mixing weights), the pixels of the
reference path; over many draws, the same distributions of op, magnitude, chain length and
mixing weights (two-sample KS and chi-square at 0.001, tests/torchvision/_stats.py) and of the
outputs' change; the recipes translate fully. Needs torchvision and timm (.venv-tv)."""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
timm_data = pytest.importorskip("timm.data", reason="timm is not installed (tvtest extra)")

import torch  # noqa: E402
import torchvision.transforms as T  # noqa: E402
import torchvision.transforms.autoaugment as tv_aa  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402
from PIL import Image  # noqa: E402
from timm.data import auto_augment as timm_aa  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed import FastLoader, ImageFolder  # noqa: E402
from gpufeed.image import augment as A  # noqa: E402
from gpufeed.synth import photo_like  # noqa: E402
from tests.torchvision._augment import COLOUR, GEOMETRY, POINT, mean_abs, rows  # noqa: E402
from tests.torchvision._folder import MEAN, STD, make_folder  # noqa: E402
from tests.torchvision._stats import assert_same_categories, assert_same_continuous  # noqa: E402

pytestmark = pytest.mark.timeout(120)
ROWS = rows(3)
N = 2000
H, W = 32, 40
_PIL = Image.new("RGB", (W, H))

# (op, magnitude): one op of the AugMix space at a magnitude it can draw
TV_OPS = [("ShearX", 0.3), ("ShearY", -0.2), ("TranslateX", 20.0), ("TranslateY", -13.0),
          ("Rotate", 30.0), ("Rotate", -10.0), ("Posterize", 2.0), ("Solarize", 113.0),
          ("AutoContrast", 0.0), ("Equalize", 0.0), ("Brightness", 0.5), ("Color", -0.4),
          ("Contrast", 0.3), ("Sharpness", 0.9)]
_WARPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


class _OneOpV1(tv_aa.AugMix):
    """torchvision's AugMix with its draws fixed: one chain of ``op`` at ``magnitude``, the
    original weighted ``m0``."""

    def __init__(self, op: str, magnitude: float, m0: float, **kwargs):
        super().__init__(mixture_width=1, chain_depth=1, **kwargs)
        self._fixed = (op, magnitude, m0)

    def _augmentation_space(self, num_bins, image_size):
        op, magnitude, _ = self._fixed
        return {op: (torch.full((num_bins,), magnitude), False)}

    def _sample_dirichlet(self, params):
        m0 = self._fixed[2]
        return torch.tensor([[m0, 1.0 - m0]]) if params.shape[-1] == 2 else torch.ones_like(params)


class _OneOpV2(V.AugMix):
    def __init__(self, op: str, magnitude: float, m0: float, **kwargs):
        super().__init__(mixture_width=1, chain_depth=1, **kwargs)
        self._fixed = (op, magnitude, m0)
        scaled = magnitude / 255.0 if op == "Solarize" else magnitude  # v2: on the 0-1 scale
        self._AUGMENTATION_SPACE = {  # type: ignore[misc]
            op: (lambda n, h, w: torch.full((n,), scaled), False)}

    _sample_dirichlet = _OneOpV1._sample_dirichlet


def _limit(op: str) -> float:
    if op in _WARPS:
        return GEOMETRY
    return COLOUR if op in ("Color", "Sharpness", "Contrast") else POINT


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("op,magnitude", TV_OPS)
def test_torchvision_one_chain_given_its_draws(version, op, magnitude):
    """torchvision runs AugMix's ops on uint8 tensors (PIL input too) and truncates the float
    mix; gpufeed's ops are PIL's: within the ops' own tolerances, after the mix."""
    m0 = 0.3
    for interpolation in ("nearest", "bilinear") if op in _WARPS else ("bilinear",):
        cls = _OneOpV1 if version == "v1" else _OneOpV2
        theirs = cls(op, magnitude, m0, interpolation=T.InterpolationMode(interpolation))
        ours = A.AugMix(mixture_width=1, chain_depth=1, interpolation=interpolation)
        weights = torch.tensor([[m0, 1.0 - m0]])
        params = (float(weights[0, 0]), (float(weights[0, 1]),), (((op, magnitude),),))
        for row in ROWS:
            tensor = torch.from_numpy(row).permute(2, 0, 1).contiguous()
            want = theirs(tensor).permute(1, 2, 0).numpy()
            got = ours.apply(row.copy(), params)
            assert mean_abs(got, want) <= _limit(op), (interpolation, mean_abs(got, want))
        if version == "v1":  # a PIL image goes through the same tensor path
            want_pil = np.asarray(theirs(Image.fromarray(ROWS[0])))
            assert np.array_equal(want_pil, theirs(torch.from_numpy(ROWS[0]).permute(2, 0, 1))
                                  .permute(1, 2, 0).numpy())


def test_torchvision_mix_is_exact_for_point_ops():
    """Where torchvision's tensor op equals PIL's (posterize, solarize, invert), the mix and its
    truncation to uint8 give the same bytes."""
    for op, magnitude in (("Posterize", 2.0), ("Solarize", 113.0)):
        theirs = _OneOpV1(op, magnitude, 0.37)
        weights = torch.tensor([[0.37, 1.0 - 0.37]])
        params = (float(weights[0, 0]), (float(weights[0, 1]),), (((op, magnitude),),))
        for row in ROWS:
            want = theirs(torch.from_numpy(row).permute(2, 0, 1)).permute(1, 2, 0).numpy()
            assert np.array_equal(A.AugMix(mixture_width=1).apply(row.copy(), params), want)


TIMM_OPS = ["AutoContrast", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
            "SharpnessIncreasing", "Equalize", "Rotate", "PosterizeIncreasing",
            "SolarizeIncreasing", "ShearX", "ShearY", "TranslateXRel", "TranslateYRel"]


class _Reseeded:
    """timm's op, with Python's generator seeded before each call (the k-th call: seed + k)."""

    def __init__(self, op, seed: int):
        self.op, self.seed, self.calls = op, seed, 0

    def __call__(self, img):
        random.seed(self.seed + self.calls)
        self.calls += 1
        return self.op(img)


def _timm_given_draws(name: str, width: int, blended: bool, seed: int, row: np.ndarray):
    """timm's AugMixAugment of one op (no magnitude noise, bilinear) on ``row``, and gpufeed's
    params for the same draws: numpy's Dirichlet and Beta, then each chain's sign from Python's
    generator seeded per chain."""
    hparams = {"translate_pct": 0.3, "img_mean": (124, 116, 104), "magnitude_std": 0,
               "interpolation": Image.BILINEAR}
    op = timm_aa.AugmentOp(name, prob=1.0, magnitude=7, hparams=hparams)
    theirs = timm_aa.AugMixAugment([_Reseeded(op, seed)], alpha=1.0, width=width, depth=1,
                                   blended=blended)
    np.random.seed(seed)
    weights = np.float32(np.random.dirichlet([1.0] * width))
    m = np.float32(np.random.beta(1.0, 1.0))
    chains = []
    for k in range(width):
        random.seed(seed + k)
        args = op.level_fn(7, hparams) if op.level_fn is not None else ()
        chains.append(((name, tuple(args), "bilinear"),))
    np.random.seed(seed)
    want = np.asarray(theirs(Image.fromarray(row)))
    return want, (tuple(float(w) for w in weights), float(m), tuple(chains))


@pytest.mark.parametrize("blended,width", [(False, 1), (False, 3), (True, 3)])
@pytest.mark.parametrize("name", TIMM_OPS)
def test_timm_given_its_draws(name, blended, width):
    """timm's AugMix runs PIL ops (gpufeed's match them) and mixes in numpy/PIL: the same within
    the ops' tolerances (the point ops exactly)."""
    ours = A.TimmAugMix(ops=(name,), magnitude=7, width=width, depth=1, blended=blended,
                        magnitude_std=0.0, translate_pct=0.3, fill=(124, 116, 104),
                        interpolation="bilinear")
    for k, row in enumerate(ROWS):
        want, params = _timm_given_draws(name, width, blended, 10 * k + width, row)
        got = ours.apply(row.copy(), params)
        if name in ("AutoContrast", "Equalize", "PosterizeIncreasing", "SolarizeIncreasing",
                    "BrightnessIncreasing", "ContrastIncreasing"):
            assert mean_abs(got, want) <= 0.02, (k, mean_abs(got, want))
        else:
            assert mean_abs(got, want) <= _limit(name.replace("Increasing", "")), mean_abs(got, want)


def recorded_tv(op, monkeypatch, n: int = N) -> list:
    """torchvision's AugMix draws: (m0, first chain weight, ((op, magnitude), ...)) per call."""
    current: list = []
    out: list = []
    sampled: list = []

    def record(img, op_name, magnitude, interpolation, fill):
        current.append((op_name, float(magnitude)))
        return img

    def sample(params):
        got = torch._sample_dirichlet(params)
        sampled.append(got)
        return got

    monkeypatch.setattr(tv_aa, "_apply_op", record)
    op._sample_dirichlet = sample
    torch.manual_seed(0)
    for _ in range(n):
        current.clear()
        sampled.clear()
        op(_PIL)
        m, mix = sampled
        out.append((float(m[0, 0]), float(mix[0, 0] * m[0, 1]), tuple(current)))
    return out


@pytest.mark.parametrize("kwargs", [{}, {"severity": 7, "mixture_width": 2, "alpha": 0.5},
                                    {"chain_depth": 2, "all_ops": False, "severity": 10}],
                         ids=["default", "s7-w2-a0.5", "d2-partial"])
def test_torchvision_draws(kwargs, monkeypatch):
    theirs = recorded_tv(tv_aa.AugMix(**kwargs), monkeypatch)
    op = A.AugMix(**kwargs)
    mine = []
    for i in range(N):
        m0, weights, chains = op.draw(A.row_rng(11, 0, i), H, W)
        mine.append((m0, weights[0], tuple(c for chain in chains for c in chain)))
    assert_same_continuous([p[0] for p in mine], [p[0] for p in theirs], "m0")
    assert_same_continuous([p[1] for p in mine], [p[1] for p in theirs], "first chain weight")
    assert_same_categories([len(p[2]) for p in mine], [len(p[2]) for p in theirs], "ops per row")
    flat_m = [c for p in mine for c in p[2]]
    flat_t = [c for p in theirs for c in p[2]]
    assert_same_categories([c[0] for c in flat_m], [c[0] for c in flat_t], "op")
    assert_same_categories([(c[0], round(c[1], 3)) for c in flat_m],
                           [(c[0], round(c[1], 3)) for c in flat_t], "op, signed magnitude")


def recorded_timm(config: str, n: int = N) -> list:
    """timm's AugMix draws: (first chain weight, m, ((op, level args, interpolation), ...))."""
    from tests.torchvision.test_augment_distributions import record_into

    aug = timm_aa.augment_and_mix_transform(config, {"translate_pct": 0.3,
                                                     "img_mean": (124, 116, 104)})
    current: list = []
    out: list = []
    record_into(aug.ops, current)
    basic = aug._apply_basic
    seen: list = []

    def apply_basic(img, mixing_weights, m):
        seen.append((float(mixing_weights[0]), float(m)))
        return basic(img, mixing_weights, m)

    aug._apply_basic = apply_basic
    random.seed(0)
    np.random.seed(0)
    for _ in range(n):
        current.clear()
        seen.clear()
        aug(_PIL)
        out.append((*seen[0], tuple(current)))
    return out


@pytest.mark.parametrize("config", ["augmix-m5-w4-d2", "augmix-m3", "augmix-m9-w2-mstd0.5"])
def test_timm_draws(config):
    theirs = recorded_timm(config)
    op = A.TimmAugMix.from_config(config, translate_pct=0.3, fill=(124, 116, 104))
    mine = []
    for i in range(N):
        weights, m, chains = op.draw(A.row_rng(13, 0, i), H, W)
        mine.append((weights[0], m, tuple(c for chain in chains for c in chain)))
    assert_same_continuous([p[0] for p in mine], [p[0] for p in theirs], "first chain weight")
    assert_same_continuous([p[1] for p in mine], [p[1] for p in theirs], "m")
    assert_same_categories([len(p[2]) for p in mine], [len(p[2]) for p in theirs], "ops per row")
    flat_m = [c for p in mine for c in p[2]]
    flat_t = [c for p in theirs for c in p[2]]
    assert_same_categories([c[0] for c in flat_m], [c[0] for c in flat_t], "op")
    assert_same_categories([c[2] for c in flat_m], [c[2] for c in flat_t], "interpolation")
    for name in ("Rotate", "ShearX", "TranslateXRel", "ColorIncreasing"):
        assert_same_continuous([c[1][0] for c in flat_m if c[0] == name],
                               [c[1][0] for c in flat_t if c[0] == name], f"{name} argument")
    for name in ("PosterizeIncreasing", "SolarizeIncreasing"):
        assert_same_categories([c[1][0] for c in flat_m if c[0] == name],
                               [c[1][0] for c in flat_t if c[0] == name], f"{name} argument")


def _change(outputs: list, row: np.ndarray) -> list:
    return [mean_abs(out, row) for out in outputs]


@pytest.mark.parametrize("which", ["torchvision", "timm"])
def test_outputs_change_the_row_as_the_reference_does(which):
    """The whole op, draws and pixels together: the per-row mean change from the original has
    the reference's distribution (KS at 0.001, 250 rows a side)."""
    n, row = 250, photo_like(H, W, seed=7)
    if which == "torchvision":
        theirs_op, ours = tv_aa.AugMix(), A.AugMix()
        torch.manual_seed(0)
        tensor = torch.from_numpy(row).permute(2, 0, 1).contiguous()
        theirs = [theirs_op(tensor).permute(1, 2, 0).numpy() for _ in range(n)]
    else:
        theirs_op = timm_aa.augment_and_mix_transform("augmix-m5-w4-d2", {"translate_pct": 0.3})
        ours = A.TimmAugMix.from_timm(theirs_op)
        random.seed(0)
        np.random.seed(0)
        theirs = [np.asarray(theirs_op(Image.fromarray(row))) for _ in range(n)]
    mine = [ours(row.copy(), A.row_rng(3, 0, i)) for i in range(n)]
    assert_same_continuous(_change(mine, row), _change(theirs, row), "mean change")
    assert_same_continuous([float(o.mean()) for o in mine], [float(o.mean()) for o in theirs],
                           "row mean")


def test_from_timm_reads_create_transforms_augmix():
    tf = timm_data.create_transform(224, is_training=True, auto_augment="augmix-m5-w4-d2")
    aug = next(t for t in tf.transforms if type(t).__name__ == "AugMixAugment")
    ours = A.TimmAugMix.from_timm(aug)
    # create_transform: translate_pct 0.3, translate_const 45% of the size, its interpolation
    assert ours == A.TimmAugMix.from_config("augmix-m5-w4-d2", translate_pct=0.3,
                                            translate_const=100, interpolation="bilinear",
                                            fill=ours.fill)
    assert ours.magnitude_std == float("inf") and ours.fill == (124, 116, 104)
    blended = timm_aa.augment_and_mix_transform("augmix-m3-b1-mstd0.5", {})
    assert A.TimmAugMix.from_timm(blended) == A.TimmAugMix.from_config("augmix-m3-b1-mstd0.5")


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return make_folder(tmp_path_factory.mktemp("augmix"))


def _recipes() -> dict[str, object]:
    return {
        "timm": timm_data.create_transform(224, is_training=True, auto_augment="augmix-m5-w4-d2"),
        "tv_v2": V.Compose([V.RandomResizedCrop(224), V.RandomHorizontalFlip(),
                            V.AugMix(severity=4, fill=[124, 116, 104]), V.ToImage(),
                            V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD)]),
        "tv_v1": T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.AugMix(),
                            T.ToTensor(), T.Normalize(MEAN, STD)]),
    }


@pytest.mark.parametrize("name", list(_recipes()))
def test_augmix_recipes_translate_fully(root, name):
    recipe = _recipes()[name]
    text = gpufeed.explain(recipe)
    labels = [line.split()[0] for line in text.splitlines()[1:]]
    assert labels == ["fast"] * len(recipe.transforms), text
    assert "gpufeed.image.augment.AugMix" in text
    assert [type(op) for op in gpufeed.from_torchvision(recipe).ops] == [
        A.TimmAugMix if name == "timm" else A.AugMix]
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpufeed.GpufeedWarning)
        ds = ImageFolder(root, transform=recipe)
    loader = FastLoader(ds, batch_size=4, num_workers=0, seed=1)
    assert loader._image_path
    first = next(iter(loader))[0]
    assert first.shape == (4, 3, 224, 224) and first.dtype == torch.float32
    torch.testing.assert_close(next(iter(FastLoader(ds, batch_size=4, num_workers=0, seed=1)))[0],
                               first, rtol=0, atol=0)


def test_split_batch_erasing_still_runs_as_given():
    """timm's JSD split-batch RandomErasing (num_splits > 0) is not gpufeed's: explain says so."""
    tf = timm_data.create_transform(224, is_training=True, auto_augment="augmix-m5-w4-d2",
                                    re_prob=0.25, re_num_splits=2)
    text = gpufeed.explain(tf)
    assert "AugMix(timm) on the uint8 row" in text
    assert "RandomErasing(num_splits>0) treats batch splits differently" in text
