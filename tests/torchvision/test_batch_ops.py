"""``batch_transform=``: the real torchvision v2 ``MixUp``/``CutMix``/``RandomChoice`` and timm's
``Mixup``, translated, give what the originals give (needs torchvision and timm: .venv-tv).

- Fidelity: the loader's batches equal each original applied to the unmixed batch with the same
  parameters (lambda, op, box), its random draw replaced by gpufeed's: images within 1e-5 (float;
  CutMix on uint8: equal), targets within 1e-6.
- Distributions: lambda, the CutMix box (its area share and place), RandomChoice's and timm's
  op choice and ``prob``: two-sample KS / chi-square at 0.001 against the originals' own draws
  (``tests/torchvision/_stats.py``), 2,000 draws a side from fixed seeds.
- The ``collate_fn=lambda b: mix(*default_collate(b))`` idiom under ``DataLoader`` and
  ``batch_transform=mix`` give batches of the same structure (types, shapes, dtypes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")
timm_mixup = pytest.importorskip("timm.data.mixup", reason="timm is not installed (tvtest extra)")

import torchvision.transforms.v2 as V  # noqa: E402
from torch.utils.data import DataLoader, default_collate  # noqa: E402

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop  # noqa: E402
from gpufeed.image._batch_ops import CUTMIX, MIXUP, batch_op_from, batch_rng  # noqa: E402
from tests.torchvision._stats import assert_same_categories, assert_same_continuous  # noqa: E402

pytestmark = pytest.mark.timeout(300)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SEED, SIZE, BATCH, CLASSES = 11, 24, 8, 3
N = 2000
H, W = 30, 40


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from gpufeed.synth import make_image_folder

    root = tmp_path_factory.mktemp("mix")
    make_image_folder(root, num_classes=CLASSES, per_class=10, size=((60, 80), (70, 90)), seed=7)
    return root


def batches(root, op, **kw):
    kw.setdefault("normalize", (MEAN, STD))
    loader = FastLoader(ImageFolder(root, transform=RandomResizedCrop(SIZE)), batch_size=BATCH, shuffle=True,
                        generator=torch.Generator().manual_seed(3), seed=SEED, batch_transform=op, **kw)
    return [(x.clone(), y.clone()) for x, y in loader]


def ours(op, b: int, n: int):
    return batch_op_from(op).draw(batch_rng(SEED, 0, b), n, SIZE, SIZE)


def torchvision_with(op, params, monkeypatch):
    """``op`` (MixUp or CutMix) with its ``make_params`` returning gpufeed's ``params``."""
    if params.kind == MIXUP:
        monkeypatch.setattr(op, "make_params", lambda flat: {"lam": params.lam})
    else:
        y1, y2, x1, x2 = params.box
        monkeypatch.setattr(op, "make_params", lambda flat: {"box": (x1, y1, x2, y2), "lam_adjusted": params.lam})
    return op


def check(got, want):
    (gx, gy), (wx, wy) = got, want
    if gx.dtype == torch.uint8:
        assert torch.equal(gx, wx)
    else:
        torch.testing.assert_close(gx, wx.as_subclass(torch.Tensor), atol=1e-5, rtol=0)
    torch.testing.assert_close(gy, wy, atol=1e-6, rtol=0)


# -- fidelity ------------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: V.MixUp(alpha=0.4, num_classes=CLASSES),
                                  lambda: V.CutMix(alpha=1.0, num_classes=CLASSES)], ids=["MixUp", "CutMix"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_torchvision_mixup_and_cutmix_given_the_same_parameters(root, make, channels_last, monkeypatch):
    plain = batches(root, None, channels_last=channels_last)
    mixed = batches(root, make(), channels_last=channels_last)
    for b, ((x, y), got) in enumerate(zip(plain, mixed)):
        op = make()
        want = torchvision_with(op, ours(op, b, len(x)), monkeypatch)(x.clone(), y)
        check(got, want)


def test_torchvision_cutmix_on_uint8_batches_is_exact(root, monkeypatch):
    plain = batches(root, None, normalize=None)
    mixed = batches(root, V.CutMix(num_classes=CLASSES), normalize=None)
    for b, ((x, y), got) in enumerate(zip(plain, mixed)):
        op = V.CutMix(num_classes=CLASSES)
        check(got, torchvision_with(op, ours(op, b, len(x)), monkeypatch)(x.clone(), y))


def test_torchvision_random_choice_given_the_same_choice_and_parameters(root, monkeypatch):
    def make():
        return V.RandomChoice([V.MixUp(alpha=0.8, num_classes=CLASSES), V.CutMix(alpha=1.0, num_classes=CLASSES)],
                              p=[0.4, 0.6])

    plain = batches(root, None)
    mixed = batches(root, make())
    for b, ((x, y), got) in enumerate(zip(plain, mixed)):
        choice = make()
        params = ours(choice, b, len(x))
        member = choice.transforms[0 if params.kind == MIXUP else 1]
        check(got, torchvision_with(member, params, monkeypatch)(x.clone(), y))


TIMM = {
    "mixup+cutmix": dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.7, switch_prob=0.5, label_smoothing=0.1),
    "cutmix-minmax": dict(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8), label_smoothing=0.0),
    "mixup-uncorrected": dict(mixup_alpha=0.3, cutmix_alpha=0.5, switch_prob=0.8, correct_lam=False),
}


@pytest.mark.parametrize("name", sorted(TIMM))
def test_timm_mixup_given_the_same_parameters(root, name, monkeypatch):
    def make():
        return timm_mixup.Mixup(num_classes=CLASSES, **TIMM[name])

    plain = batches(root, None)
    mixed = batches(root, make())
    seen = set()
    for b, ((x, y), got) in enumerate(zip(plain, mixed)):
        m = make()
        params = ours(m, b, len(x))
        seen.add(params.kind)
        # timm's draws replaced by ours: whether and which op (and lambda), then the box
        if params.kind is None:
            monkeypatch.setattr(m, "_params_per_batch", lambda: (1.0, False))
        else:
            monkeypatch.setattr(m, "_params_per_batch", lambda p=params: (p.lam, p.kind == CUTMIX))
        if params.kind == CUTMIX:
            y1, y2, x1, x2 = params.box
            monkeypatch.setattr(timm_mixup, "cutmix_bbox_and_lam",
                                lambda *a, p=params, box=(y1, y2, x1, x2), **k: (box, p.lam))
        check(got, m(x.clone(), y))
    assert seen - {None}


# -- distributions -------------------------------------------------------------------------------

def our_draws(op, n: int = N):
    bop = batch_op_from(op)
    return [bop.draw(batch_rng(7, 0, b), BATCH, H, W) for b in range(n)]


def test_torchvision_mixup_lambda_is_beta():
    op = V.MixUp(alpha=0.4, num_classes=CLASSES)
    torch.manual_seed(0)
    theirs = [op.make_params([])["lam"] for _ in range(N)]
    assert_same_continuous([p.lam for p in our_draws(op)], theirs, "MixUp lambda")


def test_torchvision_cutmix_box_area_and_place():
    op = V.CutMix(alpha=1.0, num_classes=CLASSES)
    torch.manual_seed(0)
    image = torch.zeros(1, 3, H, W)
    theirs = [op.make_params([image]) for _ in range(N)]
    mine = our_draws(op)
    assert_same_continuous([p.lam for p in mine], [t["lam_adjusted"] for t in theirs], "CutMix lambda")
    for k, what in ((2, "x1"), (0, "y1"), (3, "x2"), (1, "y2")):
        tv_k = {0: 1, 1: 3, 2: 0, 3: 2}[k]  # torchvision's box is (x1, y1, x2, y2)
        assert_same_continuous([p.box[k] for p in mine], [t["box"][tv_k] for t in theirs], f"CutMix {what}")


def test_torchvision_random_choice_picks_as_torchvision_does():
    p = [0.3, 0.7]
    choice = V.RandomChoice([V.MixUp(num_classes=CLASSES), V.CutMix(num_classes=CLASSES)], p=p)
    recorder = V.RandomChoice([lambda *a: MIXUP, lambda *a: CUTMIX], p=p)  # torchvision's own pick
    torch.manual_seed(0)
    theirs = [recorder(torch.zeros(1)) for _ in range(N)]
    assert_same_categories([d.kind for d in our_draws(choice)], theirs, "RandomChoice pick")


@pytest.mark.parametrize("name", sorted(TIMM))
def test_timm_choice_prob_and_lambda(name):
    m = timm_mixup.Mixup(num_classes=CLASSES, **TIMM[name])
    np.random.seed(0)
    theirs = []
    for _ in range(N):
        lam, cut = m._params_per_batch()
        kind = None if lam == 1.0 else (CUTMIX if cut else MIXUP)
        if kind == CUTMIX:
            _, lam = timm_mixup.cutmix_bbox_and_lam((H, W), lam, ratio_minmax=m.cutmix_minmax,
                                                    correct_lam=m.correct_lam)
        theirs.append((kind, float(lam)))
    mine = [(p.kind, p.lam) for p in our_draws(m)]
    assert_same_categories([str(k) for k, _ in mine], [str(k) for k, _ in theirs], f"timm {name}: which op")
    for kind in (MIXUP, CUTMIX):
        a = [lam for k, lam in mine if k == kind]
        b = [lam for k, lam in theirs if k == kind]
        if a or b:
            assert_same_continuous(a, b, f"timm {name}: {kind} lambda")


# -- the DataLoader idiom ------------------------------------------------------------------------

@pytest.mark.parametrize("make", [lambda: V.MixUp(num_classes=CLASSES),
                                  lambda: timm_mixup.Mixup(num_classes=CLASSES, cutmix_alpha=1.0)],
                         ids=["torchvision", "timm"])
def test_same_structure_as_the_collate_idiom_under_dataloader(root, make):
    pipeline = V.Compose([V.RandomResizedCrop(SIZE), V.ToImage(), V.ToDtype(torch.float32, scale=True),
                          V.Normalize(MEAN, STD)])
    ds = ImageFolder(root, transform=pipeline)
    mix = make()
    want = next(iter(DataLoader(ds, batch_size=BATCH, shuffle=True, collate_fn=lambda b: mix(*default_collate(b)))))
    got = next(iter(FastLoader(ds, batch_size=BATCH, shuffle=True, batch_transform=make())))
    assert type(got) is type(want) is tuple and len(got) == len(want) == 2
    for g, w in zip(got, want):
        assert type(g.as_subclass(torch.Tensor)) is type(w.as_subclass(torch.Tensor))
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
    assert got[1].shape == (BATCH, CLASSES)


@pytest.mark.parametrize("mode", ["pair", "elem"])
def test_timm_per_sample_modes_are_refused_at_construction(root, mode):
    with pytest.raises(ValueError, match=f"mode='{mode}'.*mode='batch' only"):
        FastLoader(ImageFolder(root, transform=RandomResizedCrop(SIZE)), batch_size=BATCH, normalize=(MEAN, STD),
                   batch_transform=timm_mixup.Mixup(num_classes=CLASSES, mode=mode))


def test_torchvision_mixup_on_uint8_is_refused_as_torchvision_refuses_it(root):
    with pytest.raises(RuntimeError):  # torchvision's own MixUp cannot blend a uint8 batch
        V.MixUp(num_classes=CLASSES)(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"blends pixels \(MixUp\).*uint8"):
        FastLoader(ImageFolder(root, transform=RandomResizedCrop(SIZE)), batch_size=BATCH,
                   batch_transform=V.MixUp(num_classes=CLASSES))
