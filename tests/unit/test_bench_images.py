"""The end-to-end image benchmark: the reference pipelines produce what FastLoader produces (same
shapes, dtypes, samples, nearly the same pixels), and `gpufeed bench` / `gpufeed demo` run."""

from __future__ import annotations

import pytest
import torch

from gpufeed.cli import main
from gpufeed.cli.bench import format_report
from gpufeed.compare._images import (
    CV_NAME,
    FAST_NAME,
    PIL_NAME,
    loader_factories,
    run_image_bench,
)

# Mean absolute difference from FastLoader's pixels, in 8-bit levels, EXIF-free JPEGs of about
# 400x350. Measured: eval 1.1-1.6 (PIL: antialiased resize of the whole image, then the crop;
# OpenCV: INTER_LINEAR of the whole image, then the crop; FastLoader: crop, then resize), train
# PIL 0.7-1.2, train OpenCV 0.0 (the same crop box and the same cv2.resize call).
EVAL_TOLERANCE = 3.0
TRAIN_OPENCV_TOLERANCE = 0.5


@pytest.fixture(scope="module")
def folder(image_folder):
    return image_folder(num_classes=2, per_class=6, size=((300, 360), (350, 420)), seed=3)


def _first_batches(root, transform, num_workers=0, batch_size=6):
    factories = loader_factories(root, transform, batch_size=batch_size, num_workers=num_workers, seed=7)
    out = {}
    for name, factory in factories.items():
        loader = factory()
        out[name] = next(iter(loader))
        del loader
    return out


@pytest.mark.parametrize("transform", ["eval", "train"])
def test_pipelines_yield_the_same_shapes_dtypes_and_samples(folder, transform):
    batches = _first_batches(folder, transform)
    assert list(batches) == [PIL_NAME, CV_NAME, FAST_NAME]
    for name, (images, labels) in batches.items():
        assert images.shape == (6, 3, 224, 224) and images.dtype == torch.uint8, name
        assert labels.shape == (6,) and labels.dtype == torch.int64, name
    labels = [b[1].tolist() for b in batches.values()]
    assert labels[0] == labels[1] == labels[2]  # same sampling order (shuffled for train)
    if transform == "train":
        assert sorted(labels[0]) != labels[0] or len(set(labels[0])) == 1


def test_reference_pixels_are_close_to_fastloader(folder):
    for transform, tolerance in (("eval", {PIL_NAME: EVAL_TOLERANCE, CV_NAME: EVAL_TOLERANCE}),
                                 ("train", {PIL_NAME: EVAL_TOLERANCE, CV_NAME: TRAIN_OPENCV_TOLERANCE})):
        batches = _first_batches(folder, transform)
        fast = batches[FAST_NAME][0].float()
        for name, limit in tolerance.items():
            diff = (batches[name][0].float() - fast).abs().mean().item()
            assert diff <= limit, f"{transform} {name}: mean abs diff {diff:.2f} levels > {limit}"


def test_without_pillow_opencv_is_the_baseline_and_the_report_says_pil_was_not_measured(folder):
    run = run_image_bench(folder, "eval", num_workers=0, batch_size=4, num_batches=2, num_rounds=1,
                          num_warmup_rounds=0, num_epochs=0, include_pil=False)
    assert [s.name for s in run.result.loaders] == [CV_NAME, FAST_NAME]
    assert run.baseline == CV_NAME and run.flatness is None
    assert f"note: {PIL_NAME} not measured (Pillow is not installed" in format_report(run)


def test_too_few_images_for_the_batches_is_a_clear_error(folder):
    with pytest.raises(ValueError, match="full batches per round"):
        run_image_bench(folder, "eval", num_workers=0, batch_size=4, num_batches=99)


def test_demo_refuses_a_folder_it_did_not_make(tmp_path, capsys):
    (tmp_path / "mine.txt").write_text("keep me")
    assert main(["demo", "--dir", str(tmp_path), "--images", "40", "--no-progress"]) == 1
    assert "is not a gpufeed demo folder" in capsys.readouterr().err
    assert (tmp_path / "mine.txt").read_text() == "keep me"

