"""``RandomPhotometricDistort`` on the lazy image window: its point ops wait on the window and
run at materialisation on the source part a later crop keeps (contrast's grey mean is still the
whole image's), never on a zoom-out's fill. The pixels equal the eager path's (the image read
after every op), but for hue's float rounding at the ends of the strips it computes in: at most
one level, on a few values in a million."""

from __future__ import annotations

import numpy as np
import pytest

from gpufeed.image.augment import _functional as fn
from gpufeed.image.detection import _photometric
from gpufeed.image.detection._crops import RandomIoUCrop, RandomZoomOut, window_sample
from gpufeed.image.detection._geometry import RandomHorizontalFlip, Resize
from gpufeed.image.detection._photometric import RandomPhotometricDistort
from gpufeed.image.detection._sample import Boxes, Sample, sample_rng

MEAN = (123, 117, 104)


def photo_like(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """Smooth colour gradients with noise: hue and saturation vary as in a photo."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 100 * np.sin(x / 17 + c) * np.cos(y / 23 - c) for c in range(3)], axis=-1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


def sample_of(image: np.ndarray) -> Sample:
    h, w = image.shape[:2]
    boxes = Boxes(np.array([[w * 0.2, h * 0.25, w * 0.6, h * 0.7], [w * 0.5, h * 0.1, w * 0.9, h * 0.4]]),
                  "XYXY", (h, w))
    return Sample(image, {"boxes": boxes, "labels": [1, 2]})


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    diff = np.abs(got.astype(np.int16) - want.astype(np.int16))
    assert diff.max() <= 1 and np.count_nonzero(diff) <= max(2, diff.size // 100_000), \
        f"{np.count_nonzero(diff)} values differ, by up to {diff.max()}"


PHOTO = [RandomPhotometricDistort(p=1.0), RandomPhotometricDistort(p=0.5)]
CHAIN = [RandomZoomOut(fill={"Image": MEAN, "Mask": 0}), RandomIoUCrop(), RandomHorizontalFlip(),
         Resize((48, 64))]


@pytest.mark.parametrize("seed", range(40))
def test_photometric_then_the_ssd_chain_equals_eager(seed: int) -> None:
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(40, 120)), int(rng.integers(40, 120))
    image = photo_like(rng, h, w)
    lazy, eager = sample_of(image.copy()), sample_of(image.copy())
    draws = sample_rng(seed, 0, 3)
    for op in [PHOTO[seed % 2], *CHAIN]:
        params = op.draw(draws, lazy)
        if params is None:
            continue
        lazy = op.apply(lazy, params)
        eager = op.apply(eager, params)
        eager.image  # noqa: B018 - read after every op: the eager path
    assert_close(lazy.image, eager.image)


@pytest.mark.parametrize("contrast_before", [True, False])
def test_the_ops_after_contrast_run_on_the_kept_pixels_only(monkeypatch, contrast_before) -> None:
    image = photo_like(np.random.default_rng(7), 300, 400)
    seen: list[tuple[int, ...]] = []
    hue = fn.hue
    monkeypatch.setitem(_photometric._POINT_FNS, "hue",
                        lambda row, factor: (seen.append(row.shape), hue(row, factor))[1])
    params = {"brightness_factor": 1.1, "contrast_factor": 1.3, "saturation_factor": 0.7,
              "hue_factor": 0.04, "contrast_before": contrast_before, "channel_permutation": (2, 0, 1)}
    photo = RandomPhotometricDistort()
    lazy = window_sample(photo.apply(sample_of(image.copy()), params), 50, 60, 90, 120)
    got = lazy.image
    eager = photo.apply(sample_of(image.copy()), params)
    want = eager.image[50:140, 60:180]
    assert_close(got, want)
    # hue waits on the window unless contrast comes after it (then it made contrast's mean)
    assert seen == ([(90, 120, 3), (300, 400, 3)] if contrast_before else [(300, 400, 3), (300, 400, 3)])


def test_contrast_blends_with_the_whole_images_grey_mean() -> None:
    image = photo_like(np.random.default_rng(8), 200, 240)
    image[:100] //= 4  # a dark top half: a crop's own mean would be far from the image's
    params = {"brightness_factor": None, "contrast_factor": 1.5, "saturation_factor": None,
              "hue_factor": None, "contrast_before": True, "channel_permutation": None}
    got = window_sample(RandomPhotometricDistort().apply(sample_of(image.copy()), params), 120, 0, 80, 240).image
    want = fn.contrast(image.copy(), 1.5)[120:200]
    assert got.tobytes() == want.tobytes()


def test_after_a_zoom_out_the_fill_goes_through_the_ops_too() -> None:
    image = photo_like(np.random.default_rng(9), 30, 40)
    zoom = RandomZoomOut(fill={"Image": MEAN, "Mask": 0})
    params = {"brightness_factor": 0.9, "contrast_factor": None, "saturation_factor": 1.2,
              "hue_factor": None, "contrast_before": True, "channel_permutation": (1, 2, 0)}
    sample = zoom.apply(sample_of(image.copy()), {"padding": [10, 5, 20, 15]})
    got = RandomPhotometricDistort().apply(sample, params).image
    canvas = zoom.apply(sample_of(image.copy()), {"padding": [10, 5, 20, 15]}).image.copy()
    want = fn.color(fn.brightness(canvas, 0.9), 1.2)[..., [1, 2, 0]]
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


def test_a_windows_ops_leave_its_source_as_it_was() -> None:
    image = photo_like(np.random.default_rng(10), 60, 80)
    before = image.copy()
    params = {"brightness_factor": 1.1, "contrast_factor": None, "saturation_factor": 0.6,
              "hue_factor": -0.03, "contrast_before": False, "channel_permutation": None}
    sample = RandomPhotometricDistort().apply(sample_of(image), params)
    window = sample.image_window()
    assert window is not None and len(window.ops) == 3 and window.src is image
    first = sample.image
    assert image.tobytes() == before.tobytes()
    again = Sample.windowed(window, {}).image  # the same window read twice: the same pixels
    assert again.tobytes() == first.tobytes()


def test_color_jitter_waits_on_the_window_too() -> None:
    from gpufeed.image.augment import ColorJitter
    from gpufeed.image.detection._photometric import ImageOnly

    image = photo_like(np.random.default_rng(11), 120, 160)
    jitter = ImageOnly(ColorJitter(brightness=0.3, contrast=0.4, saturation=0.5, hue=0.05))
    for seed in range(12):
        params = jitter.draw(sample_rng(seed, 0, 0), sample_of(image))
        lazy = window_sample(jitter.apply(sample_of(image.copy()), params), 20, 30, 70, 90)
        window = lazy.image_window()
        names = [i for i, _ in params[0]]
        assert window is not None and len(window.ops) == len(names) - names.index(1)  # from contrast on
        want = jitter.row_op.apply(image.copy(), params[0])[20:90, 30:120]
        assert_close(lazy.image, want)
