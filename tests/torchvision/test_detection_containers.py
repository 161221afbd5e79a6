"""torchvision v2's containers (``RandomApply``, ``RandomChoice``, ``RandomOrder``) in a
detection pipeline become gpufeed's containers of joint ops (``_containers``): what translates
and what runs as given, the containers' choices against torchvision's own (chi-square at 0.001
from fixed seeds), inner ops drawing on the sample the op before them left, and the same batches
for any number of workers. Batches against torchvision's wrapped COCO: the "containers" pipeline
of test_detection_parity.py. Needs torchvision (.venv-tv)."""

from __future__ import annotations

import numpy as np
import pytest

tv = pytest.importorskip(
    "torchvision", reason="torchvision is not installed in this venv; `make test` runs "
    "tests/torchvision in .venv-tv")

import torch  # noqa: E402
import torchvision.transforms.v2 as V  # noqa: E402

import gpufeed  # noqa: E402
from gpufeed._synth_coco import make_coco  # noqa: E402
from gpufeed.image.detection import AsGiven, JointOp, Sample, translate_detection  # noqa: E402
from gpufeed.image.detection import _containers as C  # noqa: E402
from gpufeed.image.detection._crops import RandomIoUCrop, RandomZoomOut  # noqa: E402
from gpufeed.image.detection._sample import Boxes  # noqa: E402
from tests.torchvision._augment import run_container  # noqa: E402
from tests.torchvision._stats import assert_same_categories  # noqa: E402

pytestmark = pytest.mark.timeout(300)
N = 2000


def _report(*ops):
    pipeline, report = translate_detection(V.Compose([*ops, V.ToImage(), V.ToPureTensor()]))
    return pipeline, report


def test_containers_of_ops_gpufeed_has_become_its_containers():
    pipeline, report = _report(
        V.RandomApply([V.RandomZoomOut(side_range=(1.0, 2.0)), V.RandomIoUCrop()], p=0.7),
        V.RandomChoice([V.RandomShortestSize([200, 300], max_size=500),
                        V.Compose([V.RandomResize(100, 200), V.RandomCrop(90, pad_if_needed=True)]),
                        V.Identity()], p=[2, 1, 1]),
        V.RandomOrder([V.ColorJitter(0.2, 0.2), V.RandomHorizontalFlip(), V.RandomPerspective()]))
    assert "RandomApply: fast: gpufeed container of RandomZoomOut, RandomIoUCrop" in report, report
    assert ("RandomChoice: fast: gpufeed container of RandomShortestSize, "
            "Compose(RandomResize, RandomCrop), Identity") in report, report
    assert ("RandomOrder: fast, partly tensor (as given): gpufeed container of ColorJitter, "
            "RandomHorizontalFlip, RandomPerspective [tensor (as given)]") in report, report
    apply, choice, order = pipeline.ops
    assert isinstance(apply, C.RandomApply) and apply.p == 0.7
    assert isinstance(choice, C.RandomChoice) and choice.p == (0.5, 0.25, 0.25)
    assert isinstance(choice.transforms[1], C.Compose) and choice.transforms[2] == C.Compose(())
    assert isinstance(order, C.RandomOrder) and isinstance(order.transforms[2], AsGiven)
    assert all(isinstance(op, AsGiven) for op in pipeline.fallback)  # rotated boxes: as given


def test_a_container_holding_a_conversion_runs_as_given_and_one_holding_a_callable_on_pil_blocks():
    _, report = _report(V.RandomApply([V.ToImage()]))
    assert "RandomApply: tensor (as given): ToImage inside it" in report, report
    pipeline, report = _report(V.RandomApply([lambda image, target: (image, target)]))
    assert pipeline is None and "RandomApply holds a callable that is not torchvision's" in report
    pipeline, report = translate_detection(V.Compose([
        V.ToImage(), V.RandomApply([lambda image, target: (image, target)]), V.ToPureTensor()]))
    assert "RandomApply: tensor (as given): gpufeed container of function [tensor (as given)]" in report


class _Record(JointOp):
    """A gpufeed joint op that records its index when it runs."""

    def __init__(self, i, seen):
        self.i, self.seen, self.name = i, seen, f"mark{i}"

    def draw(self, rng, sample):
        return True

    def apply(self, sample, params):
        self.seen.append(self.i)
        return sample


def _ours(make, k):
    seen, out = [], []
    container = make(tuple(_Record(i, seen) for i in range(k)))
    rng = np.random.default_rng(0)
    sample = Sample(np.zeros((2, 2, 3), np.uint8), {})
    for _ in range(N):
        seen.clear()
        container(sample, rng)
        out.append(tuple(seen))
    return out


@pytest.mark.parametrize("which", ["apply", "choice", "choice-uniform", "order"])
def test_the_containers_choose_as_torchvisions(which):
    weights = [1, 2, 3]
    theirs_make, ours_make, k = {
        "apply": (lambda m: V.RandomApply(m, p=0.3), lambda m: C.RandomApply(m, p=0.3), 2),
        "choice": (lambda m: V.RandomChoice(m, p=weights), lambda m: C.RandomChoice(m, p=weights), 3),
        "choice-uniform": (V.RandomChoice, C.RandomChoice, 3),
        "order": (V.RandomOrder, C.RandomOrder, 3),
    }[which]
    theirs, ours = run_container(theirs_make, k, N), _ours(ours_make, k)
    assert_same_categories(ours, theirs, which)
    assert {len(t) for t in ours} == ({0, k} if which == "apply" else {1} if "choice" in which else {k})


def test_an_inner_op_draws_on_the_sample_the_op_before_it_left():
    """RandomIoUCrop after RandomZoomOut inside RandomApply: its crop lies within the
    zoomed-out canvas, as in torchvision, where the inner ops draw when they run."""
    boxes = Boxes(np.array([[10.0, 10.0, 30.0, 40.0], [40.0, 5.0, 60.0, 25.0]]), "XYXY", (50, 70))
    sample = Sample(np.zeros((50, 70, 3), np.uint8), {"boxes": boxes})
    op = C.RandomApply((RandomZoomOut(side_range=(2.0, 3.0), p=1.0), RandomIoUCrop()), p=1.0)
    rng = np.random.default_rng(5)
    sizes = [op(sample, rng).image.shape[:2] for _ in range(200)]
    # crops taller than the source and not of the canvas's shape (a crop not taken leaves the
    # zoomed-out canvas, 50:70 like the source): drawn on the zoomed-out canvas, never on the
    # source as given to the container (then every crop would fit in 50 x 70)
    assert any(h > 50 and abs(h / w - 50 / 70) > 0.03 for h, w in sizes), sizes
    params = op.draw(np.random.default_rng(1), sample)
    first, second = op.apply(sample, params), op.apply(sample, params)  # apply draws from params only
    assert np.array_equal(first.image, second.image)
    assert np.array_equal(first.target["boxes"].data, second.target["boxes"].data)


def test_the_batches_are_the_same_for_any_number_of_workers(tmp_path):
    coco = make_coco(tmp_path, 12, seed=9, empty_fraction=0.0)
    pipeline = V.Compose([
        V.RandomApply([V.RandomZoomOut(side_range=(1.0, 2.0)), V.RandomIoUCrop()], p=0.6),
        V.RandomChoice([V.RandomHorizontalFlip(p=1.0), V.RandomVerticalFlip(p=1.0), V.Identity()]),
        V.RandomOrder([V.ColorJitter(0.3, 0.3), V.RandomPerspective(p=1.0)]),
        V.Resize((96, 128)), V.ToImage(), V.SanitizeBoundingBoxes(), V.ToPureTensor()])
    ds = gpufeed.CocoDetection(coco.root, coco.ann_file, transforms=pipeline,
                               target_keys=["image_id", "boxes", "labels", "masks"])

    def epoch(workers):
        loader = gpufeed.FastLoader(ds, batch_size=3, num_workers=workers, seed=4,
                                    collate_fn=lambda b: tuple(zip(*b)))
        assert loader.stats()["path"] == "image"
        return [s for images, targets in loader for s in zip(images, targets)]

    a, b = epoch(0), epoch(2)
    assert len(a) == len(b) == 12
    for (ia, ta), (ib, tb) in zip(a, b):
        assert torch.equal(ia, ib)
        assert all(torch.equal(ta[k], tb[k]) for k in ("boxes", "labels", "masks"))
    assert len({tuple(i.shape) for i, _ in a}) == 1  # Resize last: one size
