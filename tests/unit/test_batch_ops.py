"""Batch ops (MixUp, CutMix) without torchvision or timm: their recognition by class module,
name and attributes (stand-in classes here; the real ones in tests/torchvision/test_batch_ops.py),
the fused MixUp pass against the two-pass arithmetic, and the loader's batches: the same for any
``num_workers``, exact on resume, skipped samples left out before pairing, the GPU variant (on
CPU tensors: it has not run on a GPU) equal to the workers'."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from gpufeed import FastLoader, ImageFolder, MultiView, RandomResizedCrop
from gpufeed.cuda._transform import GpuTransform
from gpufeed.image._batch_ops import (
    CUTMIX,
    MIXUP,
    BatchOp,
    Mix,
    MixParams,
    batch_op_from,
    batch_rng,
    convert_mixed_,
)
from gpufeed.image._normalize import affine, convert_

pytestmark = pytest.mark.timeout(300)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NORMALIZE = (MEAN, STD)


def stand_in(module: str, name: str, **attrs):
    """An object whose class has ``module`` and ``name``, with ``attrs`` (as the real op has)."""
    cls = type(name, (), {"__module__": module, "__call__": lambda self, *a: a})
    obj = cls()
    for k, v in attrs.items():
        setattr(obj, k, v)
    return obj


def tv_mixup(alpha=1.0, num_classes=3):
    return stand_in("torchvision.transforms.v2._augment", "MixUp", alpha=alpha, num_classes=num_classes)


def tv_cutmix(alpha=1.0, num_classes=3):
    return stand_in("torchvision.transforms.v2._augment", "CutMix", alpha=alpha, num_classes=num_classes)


def timm_mixup(**kw):
    attrs = dict(mixup_alpha=0.8, cutmix_alpha=1.0, cutmix_minmax=None, mix_prob=1.0, switch_prob=0.5,
                 mode="batch", correct_lam=True, label_smoothing=0.1, num_classes=3, multi_label=False,
                 mixup_enabled=True)
    attrs.update(kw)
    return stand_in("timm.data.mixup", "Mixup", **attrs)


# -- recognition ---------------------------------------------------------------------------------

def test_torchvision_and_timm_ops_are_read_into_batch_ops():
    op = batch_op_from(tv_mixup(0.2, 10))
    assert op.mixes == (Mix(MIXUP, 0.2),) and op.num_classes == 10 and op.pairing == "roll"
    choice = stand_in("torchvision.transforms.v2._container", "RandomChoice",
                      transforms=[tv_mixup(0.8), tv_cutmix(1.0)], p=[0.25, 0.75])
    op = batch_op_from(choice)
    assert [m.kind for m in op.mixes] == [MIXUP, CUTMIX] and op.weights == (0.25, 0.75)
    op = batch_op_from(timm_mixup(mix_prob=0.6, switch_prob=0.3))
    assert op.pairing == "flip" and op.prob == 0.6 and op.weights == (0.7, 0.3) and op.label_smoothing == 0.1
    assert op.mixes[1] == Mix(CUTMIX, 1.0, "timm", None, True)
    op = batch_op_from(timm_mixup(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8)))
    assert op.mixes == (Mix(CUTMIX, 1.0, "timm", (0.2, 0.8), True),)


@pytest.mark.parametrize("given,error,match", [
    (lambda x, y: (x, y), TypeError, r"`batch_transform` must be torchvision.*MixUp.*timm.data.Mixup.*training step"),
    (object(), TypeError, "`batch_transform` must be"),
    (stand_in("torchvision.transforms.v2._geometry", "RandomHorizontalFlip", p=0.5), TypeError, "must be"),
    (timm_mixup(mode="pair"), ValueError, r"mode='pair'.*mode='batch' only"),
    (timm_mixup(mode="elem"), ValueError, r"mode='elem'.*mode='batch' only"),
    (timm_mixup(multi_label=True), ValueError, "multi_label"),
    (timm_mixup(mixup_alpha=0.0, cutmix_alpha=0.0), ValueError, "mixup_alpha > 0"),
    (tv_mixup(num_classes=None), ValueError, r"needs `num_classes`.*Found: None"),
    (stand_in("torchvision.transforms.v2._container", "RandomChoice", transforms=[tv_mixup(), object()], p=None),
     TypeError, "MixUp or CutMix only"),
    (stand_in("torchvision.transforms.v2._container", "RandomChoice",
              transforms=[tv_mixup(num_classes=3), tv_cutmix(num_classes=4)], p=None), ValueError, "disagree"),
])
def test_anything_else_is_refused_naming_what_is_accepted(given, error, match):
    with pytest.raises(error, match=match):
        batch_op_from(given)


# -- the draws -----------------------------------------------------------------------------------

@pytest.mark.parametrize("given", [tv_cutmix(), timm_mixup(mixup_alpha=0.0),
                                   timm_mixup(mixup_alpha=0.0, cutmix_minmax=(0.2, 0.8))])
def test_cutmix_boxes_lie_in_the_image_and_lambda_is_the_uncovered_share(given):
    op = batch_op_from(given)
    for i in range(300):
        p = op.draw(batch_rng(1, 0, i), 8, 30, 40)
        y1, y2, x1, x2 = p.box
        assert 0 <= y1 <= y2 <= 30 and 0 <= x1 <= x2 <= 40
        assert math.isclose(p.lam, 1 - (y2 - y1) * (x2 - x1) / 1200)


def test_draws_depend_on_seed_epoch_and_batch_only():
    op = batch_op_from(timm_mixup(mix_prob=0.5))
    a = [op.draw(batch_rng(5, e, b), 8, 32, 32) for e in range(2) for b in range(20)]
    assert a == [op.draw(batch_rng(5, e, b), 8, 32, 32) for e in range(2) for b in range(20)]
    assert len({p.lam for p in a}) > 10 and any(p.kind is None for p in a)


# -- the fused MixUp pass ------------------------------------------------------------------------

@pytest.mark.parametrize("pairing", ["roll", "flip"])
@pytest.mark.parametrize("dtype,channels_last", [(torch.float32, False), (torch.float32, True),
                                                 (torch.float16, False), (torch.bfloat16, True)])
@pytest.mark.parametrize("n", [0, 1, 2, 5, 8])
def test_mixup_fused_into_the_dtype_pass_equals_normalize_then_mix(pairing, dtype, channels_last, n):
    g = torch.Generator().manual_seed(n)
    images = torch.randint(0, 256, (n, 3, 12, 10), dtype=torch.uint8, generator=g)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    images = images.contiguous(memory_format=fmt)
    constants = affine(NORMALIZE, torch.float32)
    lam = 0.3
    want = convert_(torch.empty(images.shape, dtype=torch.float32), images, constants)
    partner = want.roll(1, 0) if pairing == "roll" else want.flip(0)
    want = (lam * want + (1 - lam) * partner).to(dtype)
    out = torch.empty(images.shape, dtype=dtype).contiguous(memory_format=fmt)
    got = convert_mixed_(out, images, constants, lam, pairing)
    assert got is out
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=0)


def test_soft_targets_are_smoothed_one_hots_mixed_with_the_partners():
    op = BatchOp((Mix(MIXUP, 1.0),), (1.0,), num_classes=4, label_smoothing=0.2, pairing="flip")
    labels = torch.tensor([0, 3, 1])
    got = op.soft_targets(labels, MixParams(MIXUP, 0.75))
    off, on = 0.05, 0.85
    y = torch.full((3, 4), off)
    y[torch.arange(3), labels] = on
    torch.testing.assert_close(got, 0.75 * y + 0.25 * y.flip(0))
    torch.testing.assert_close(op.soft_targets(labels, MixParams(None)), y)  # unmixed: still smoothed


# -- the loader ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from gpufeed.synth import make_image_folder

    root = tmp_path_factory.mktemp("mix")
    make_image_folder(root, num_classes=3, per_class=10, size=((60, 80), (70, 90)), seed=7)
    return root


def loader(root, op, num_workers=0, **kw):
    kw.setdefault("normalize", NORMALIZE)
    kw.setdefault("shuffle", True)
    return FastLoader(ImageFolder(root, transform=RandomResizedCrop(24)), batch_size=8,
                      generator=torch.Generator().manual_seed(3), num_workers=num_workers, seed=11,
                      batch_transform=op, **kw)


def epoch(batches):
    return [(x.clone(), y.clone()) for x, y in batches]


def same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(a, b))


OPS = {
    "tv-mixup": lambda: tv_mixup(),
    "tv-cutmix": lambda: tv_cutmix(),
    "tv-choice": lambda: stand_in("torchvision.transforms.v2._container", "RandomChoice",
                                  transforms=[tv_mixup(), tv_cutmix()], p=[0.5, 0.5]),
    "timm": lambda: timm_mixup(mix_prob=0.8),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_batches_are_the_same_for_any_num_workers_and_targets_are_soft(root, name):
    one = epoch(loader(root, OPS[name]()))
    assert [tuple(y.shape) for _, y in one] == [(8, 3)] * 3 + [(6, 3)]
    assert all(y.dtype == torch.float32 and torch.allclose(y.sum(1), torch.ones(len(y))) for _, y in one)
    two = epoch(loader(root, OPS[name](), num_workers=2))
    assert same(one, two)
    mixed = sum(int((y.max(1).values < 0.999).any()) for _, y in one)
    assert mixed >= 1


def test_the_images_are_the_op_applied_to_the_unmixed_batch(root):
    op = OPS["tv-choice"]()
    plain = epoch(loader(root, None))
    mixed = epoch(loader(root, op))
    bop = batch_op_from(op)
    for b, ((x, y), (mx, my)) in enumerate(zip(plain, mixed)):
        params = bop.draw(batch_rng(11, 0, b), len(x), 24, 24)
        torch.testing.assert_close(bop.mix_(x.clone(), params), mx, atol=1e-5, rtol=0)
        torch.testing.assert_close(bop.soft_targets(y, params), my, atol=1e-6, rtol=0)


def test_cutmix_on_uint8_output_pastes_whole_pixels(root):
    plain = epoch(loader(root, None, normalize=None))
    mixed = epoch(loader(root, tv_cutmix(), normalize=None, channels_last=True))
    op = batch_op_from(tv_cutmix())
    for b, ((x, _), (mx, _)) in enumerate(zip(plain, mixed)):
        assert mx.dtype == torch.uint8
        assert torch.equal(op.paste_(x.clone(), op.draw(batch_rng(11, 0, b), len(x), 24, 24)), mx)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch_gives_the_same_remaining_batches(root, num_workers):
    full = epoch(loader(root, OPS["timm"](), num_workers=num_workers))
    first = loader(root, OPS["timm"](), num_workers=num_workers)
    it = iter(first)
    next(it)
    next(it)
    state = first.state_dict()
    del it
    second = loader(root, OPS["timm"](), num_workers=2 - num_workers)
    second.load_state_dict(state)
    assert same(epoch(second), full[2:])


def test_a_skipped_sample_is_left_out_before_pairing(root, tmp_path):
    import shutil

    bad = tmp_path / "root"
    shutil.copytree(root, bad)
    victim = sorted((bad / sorted(p.name for p in bad.iterdir())[0]).iterdir())[0]
    victim.write_bytes(b"not a jpeg")
    got = epoch(loader(bad, tv_mixup(), on_error="skip", shuffle=False))
    plain = epoch(loader(bad, None, on_error="skip", shuffle=False))
    op = batch_op_from(tv_mixup())
    assert sum(len(x) for x, _ in got) == 29
    for b, ((x, y), (mx, my)) in enumerate(zip(plain, got)):
        params = op.draw(batch_rng(11, 0, b), len(x), 24, 24)
        torch.testing.assert_close(op.mix_(x.clone(), params), mx, atol=1e-5, rtol=0)
        torch.testing.assert_close(op.soft_targets(y, params), my, atol=1e-6, rtol=0)


def test_the_option_is_an_attribute_kept_by_replace_and_pickling(root):
    import pickle

    op = tv_mixup()
    made = loader(root, op)
    assert made.batch_transform is op
    assert made.replace(num_workers=2).batch_transform is op
    assert same(epoch(made.replace(num_workers=2)), epoch(loader(root, op)))
    with pytest.raises(ValueError, match="batch_transform attribute should not be set"):
        made.batch_transform = None
    assert pickle.loads(pickle.dumps(loader(root, None))).batch_transform is None


def test_refusals_at_construction(root):
    with pytest.raises(TypeError, match="`batch_transform` must be"):
        loader(root, lambda x, y: (x, y))
    with pytest.raises(ValueError, match=r"blends pixels \(MixUp\).*uint8.*normalize="):
        loader(root, tv_mixup(), normalize=None)
    with pytest.raises(ValueError, match=r"blends pixels.*CutMix\s+alone"):
        loader(root, timm_mixup(), dtype=torch.uint8, normalize=None)
    with pytest.raises(ValueError, match="target_transform"):
        FastLoader(ImageFolder(root, transform=RandomResizedCrop(24), target_transform=lambda y: y + 1),
                   batch_size=4, normalize=NORMALIZE, batch_transform=tv_mixup())
    with pytest.raises(ValueError, match="`batch_transform` only applies to the image fast path"):
        FastLoader(torch.utils.data.TensorDataset(torch.zeros(4, 3)), batch_size=2, batch_transform=tv_mixup())
    with pytest.raises(ValueError, match="MultiView of 2 views"):
        FastLoader(ImageFolder(root, transform=MultiView([RandomResizedCrop(24), RandomResizedCrop(16)])),
                   batch_size=4, normalize=NORMALIZE, batch_transform=tv_cutmix())


# -- device="cuda": the GPU transform, on CPU tensors --------------------------------------------

@pytest.mark.parametrize("name", sorted(OPS))
@pytest.mark.parametrize("channels_last", [False, True])
def test_the_gpu_variant_gives_the_workers_batches(root, name, channels_last):
    """The worker's half with device="cuda" (uint8 rows, int64 labels, the drawn parameters),
    then GpuTransform.apply_batch as CudaIter calls it after the copy. Run on CPU tensors only:
    this has not run on a GPU."""
    from gpufeed._fastpath.feed import make_image_feed
    from gpufeed._fastpath.local import LocalImageIter
    from gpufeed.stats import Stats

    want = epoch(loader(root, OPS[name](), channels_last=channels_last))
    made = loader(root, OPS[name](), channels_last=channels_last)
    feed = make_image_feed(made, channels_last=channels_last, normalize=NORMALIZE, dtype=None, on_error="raise",
                           cache_budget=0, seed=11, on_gpu=True, batch_transform=made.batch_transform)
    assert feed.plan.dtype == torch.uint8 and feed.gpu_transform.batch_op is not None
    host = list(LocalImageIter(made, feed, Stats(), 0))
    assert all(len(b) == 3 and isinstance(b[2], MixParams) for b in host)
    got = [feed.gpu_transform.apply_batch(b) for b in host]
    assert len(got) == len(want)
    for (x, y), (gx, gy) in zip(want, got):
        torch.testing.assert_close(gx, x, atol=1e-5, rtol=0)
        torch.testing.assert_close(gy, y, atol=1e-6, rtol=0)


def test_the_cuda_iterator_copies_tensors_only_and_never_waits_on_the_host():
    from gpufeed.cuda._feed import CudaFeed
    from gpufeed.stats import Stats
    from tests.unit.test_cuda_feed_cpu import Gpu, Ops

    gpu = Gpu()
    feed = CudaFeed(torch.device("cpu"), prefetch_batches=2, stats=Stats(), ops=Ops(gpu))
    op = batch_op_from(tv_cutmix(num_classes=5))
    feed.gpu_transform = GpuTransform(torch.float32, NORMALIZE, False, op)
    rng = np.random.default_rng(0)
    host = [(torch.from_numpy(rng.integers(0, 256, (4, 3, 16, 16), dtype=np.uint8)),
             torch.tensor([0, 1, 2, 4]), op.draw(batch_rng(0, 0, b), 4, 16, 16)) for b in range(3)]
    got = list(feed.wrap(iter(host)))
    gpu.done()
    assert gpu.syncs() == []
    assert len([c for c in gpu.log if c[0] == "copy"]) == 2 * 3  # images and labels; the params stay on the host
    for (x, labels, params), (gx, gy) in zip(host, got):
        want = op.paste_(convert_(torch.empty(x.shape), x, affine(NORMALIZE, torch.float32)), params)
        torch.testing.assert_close(gx, want)
        torch.testing.assert_close(gy, op.soft_targets(labels, params))


def test_explain_says_what_runs_and_where(root):
    import gpufeed

    text = gpufeed.explain(loader(root, OPS["timm"]()))
    assert ("batch_transform: MixUp(alpha=0.8 p=0.5) or CutMix(alpha=1 p=0.5), prob=0.8, label_smoothing=0.1, "
            "num_classes=3, paired by flip (from timm Mixup), in the workers") in text


def test_a_worker_killed_mid_epoch_reruns_its_batches_identically(root):
    """The batch op's draws are keyed by the batch number, never the worker: the batches the
    killed worker left unanswered are re-run by its replacement with the same parameters."""
    import os
    import signal

    want = epoch(loader(root, OPS["tv-choice"]()))
    it = iter(loader(root, OPS["tv-choice"](), num_workers=2, prefetch_factor=2))
    got = []
    for k, (x, y) in enumerate(it):
        got.append((x.clone(), y.clone()))
        if k == 0:
            os.kill(it.worker_pids[1], signal.SIGKILL)
    assert it.worker_restarts == 1
    assert same(got, want)


@pytest.mark.parametrize("normalize", [None, NORMALIZE])
def test_a_cached_epoch_is_mixed_from_the_unmixed_rows(root, normalize):
    """CutMix pastes into the uint8 rows: with a batch op the cache keeps encoded bytes, never
    mixed rows, so the second epoch is the op applied to the unmixed batch again."""
    from gpufeed import ResizeCenterCrop

    def two_epochs(op):
        made = FastLoader(ImageFolder(root, transform=ResizeCenterCrop(24, 28)), batch_size=8, shuffle=True,
                          generator=torch.Generator().manual_seed(3), seed=11, normalize=normalize,
                          cache_bytes="64MB", batch_transform=op)
        return epoch(made), epoch(made)

    plain = two_epochs(None)[1]
    first, second = two_epochs(tv_cutmix())
    op = batch_op_from(tv_cutmix())
    for b, ((x, y), (mx, my)) in enumerate(zip(plain, second)):
        params = op.draw(batch_rng(11, 1, b), len(x), 24, 24)
        torch.testing.assert_close(op.mix_(x.clone(), params), mx, atol=1e-5, rtol=0)
        torch.testing.assert_close(op.soft_targets(y, params), my)
