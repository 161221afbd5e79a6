"""Several views per image (``gpufeed.MultiView``, docs/design/sample-model.md, stage 3): each view
against its transform alone, one decode per sample at the largest demand, the batch's structure
against DataLoader's, identical batches for num_workers 0 to 3, exact resume, a worker's death."""

from __future__ import annotations

import math
import os
import signal
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
import gpufeed.image._transforms as transforms_module
from gpufeed import FastLoader, ImageFolder, MultiView, RandomResizedCrop, ResizeCenterCrop
from gpufeed.errors import GpufeedWarning
from gpufeed.image.augment import ColorJitter, RandomErasing, RandomGrayscale
from gpufeed.synth import encode, large_photo
from tests.integration._batches import interrupted

pytestmark = pytest.mark.timeout(120)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 4


@pytest.fixture(scope="module")
def root(image_folder) -> Path:
    return image_folder(num_classes=2, per_class=7, size=((60, 90), (70, 100)), seed=31)


def dino(float_ops: bool = False) -> MultiView:
    """DINO's multi-crop at small sizes: 2 global views, 3 local ones with their own ops."""
    global_view = RandomResizedCrop(32, scale=(0.4, 1.0), ops=(ColorJitter(0.4, 0.4, 0.2),),
                                    float_ops=(RandomErasing(0.5),) if float_ops else ())
    local_view = RandomResizedCrop(16, scale=(0.05, 0.4), ops=(RandomGrayscale(0.2),))
    return MultiView([global_view] * 2 + [local_view] * 3)


def row(transform: Any, data: bytes, index: int, epoch: int = 0, seed: int = 0) -> np.ndarray:
    out = np.empty((3, *transform.output_size), np.uint8)
    transform.apply(data, index=index, epoch=epoch, seed=seed, out=out)
    return out


def files(root: Path) -> list[bytes]:
    return [Path(path).read_bytes() for path, _ in ImageFolder(root).samples]


# -- views against their transform alone -----------------------------------------------------------


def test_each_view_is_its_transform_alone_byte_for_byte_at_the_same_decode_scale(root):
    """View v equals its transform (keyed as view v) applied alone, byte for byte, where the
    decode scale the views share is the one it picks alone (where another view asked for more
    pixels: the photo test below). View 0 equals the transform given, under its own keys."""
    views = dino()
    same = other = 0
    for index, data in enumerate(files(root)):
        header = gpufeed.read_header(data)
        shared = demand_factor(views.views, header.height, header.width, index, 1, 5)
        got = views.outputs(data, index=index, epoch=1, seed=5)
        for v, view in enumerate(views.views):
            alone = row(view, data, index, 1, 5)
            if demand_factor([view], header.height, header.width, index, 1, 5) == shared:
                assert np.array_equal(got[v].numpy(), alone), (index, v)
                if v == 0:  # the transform as given: the same keys
                    assert np.array_equal(got[0].numpy(), row(views.pipelines[0], data, index, 1, 5))
                same += 1
            else:
                other += 1
    assert same > 0 and other > 0


def test_one_view_multiview_is_the_transform_itself(root):
    t = RandomResizedCrop(40, ops=(ColorJitter(0.4, 0.4, 0.4),))
    for index, data in enumerate(files(root)[:6]):
        (got,) = MultiView([t]).outputs(data, index=index, epoch=2, seed=9)
        assert np.array_equal(got.numpy(), row(t, data, index, 2, 9))


def test_identical_pipelines_at_two_positions_draw_independently():
    views = MultiView([RandomResizedCrop(32)] * 2)
    crops = [tuple(view.params(0, 0, index, 300, 400) for view in views.views) for index in range(50)]
    assert sum(a == b for a, b in crops) == 0


def demand_factor(views: Any, height: int, width: int, index: int, epoch: int = 0, seed: int = 0) -> float:
    """The DCT factor the most demanding of ``views`` needs, written from the design's rule."""
    scale = 0.0
    for view in views:
        p = view.params(seed, epoch, index, height, width)
        oh, ow = view.output_size
        scale = max(scale, oh / p.height, ow / p.width)
    for factor in (1 / 8, 1 / 4, 1 / 2, 1.0):
        if (math.ceil(height * factor) >= height * scale - 1e-9
                and math.ceil(width * factor) >= width * scale - 1e-9):
            return factor
    return 1.0


@pytest.fixture(scope="module")
def photo() -> bytes:
    return encode(large_photo(1200, 1600, seed=4), quality=90)


def test_one_decode_per_sample_at_the_largest_demand(photo, monkeypatch):
    decoded: list[tuple[int, int]] = []
    real, real_rows = transforms_module.decode, transforms_module.decode_rows

    def counting(*args: Any, **kw: Any) -> np.ndarray:
        img = real(*args, **kw)
        decoded.append(img.shape[:2])
        return img

    def counting_rows(*args: Any, **kw: Any) -> int:  # a decode cut at the views' lowest row
        decoded.append(kw["out"].shape[:2])
        return real_rows(*args, **kw)

    monkeypatch.setattr(transforms_module, "decode", counting)
    monkeypatch.setattr(transforms_module, "decode_rows", counting_rows)
    views = MultiView([RandomResizedCrop(224, scale=(0.4, 1.0))] * 2
                      + [RandomResizedCrop(96, scale=(0.05, 0.4))] * 6)
    factors = set()
    for index in range(40):
        decoded.clear()
        views.outputs(photo, index=index)
        assert len(decoded) == 1  # one decode for eight views
        factor = demand_factor(views.views, 1200, 1600, index)
        factors.add(factor)
        assert decoded[0] == (math.ceil(1200 * factor), math.ceil(1600 * factor)), index
    assert len(factors) >= 2  # some samples need a local view's larger demand


def test_a_view_decoded_at_another_view_s_scale_is_within_the_dct_tolerance(photo):
    views = MultiView([RandomResizedCrop(224, scale=(0.4, 1.0)), RandomResizedCrop(96, scale=(0.05, 0.2))])
    diffs = []
    for index in range(12):
        got = views.outputs(photo, index=index)[0].numpy().astype(np.int16)
        alone = row(views.views[0], photo, index).astype(np.int16)  # its own (smaller) decode
        diffs.append(float(np.abs(got - alone).mean()))
    assert max(diffs) <= 2.5, diffs


# -- the loader ------------------------------------------------------------------------------------


def loader(root: Path, num_workers: int, **kw: Any) -> FastLoader:
    fl = FastLoader(ImageFolder(root, transform=kw.pop("transform", dino(True))), batch_size=BATCH,
                    num_workers=num_workers, shuffle=True, seed=4,
                    generator=torch.Generator().manual_seed(8), **kw)
    assert fl._image_path, fl.stats()["path_reason"]
    return fl


def assert_same(got: list[Any], want: list[Any]) -> None:
    assert len(got) == len(want)
    for k, ((images, labels), (want_images, want_labels)) in enumerate(zip(got, want)):
        assert isinstance(images, list) and len(images) == len(want_images), k
        for v, (a, b) in enumerate(zip(images, want_images)):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride(), (k, v)
            assert torch.equal(a, b), (k, v)
        assert torch.equal(labels, want_labels), k


def test_batches_have_dataloader_s_structure_and_bytes(root):
    ds = ImageFolder(root, transform=dino())
    images, target = ds[3]
    assert isinstance(images, list) and [tuple(t.shape) for t in images] == [(3, 32, 32)] * 2 + [(3, 16, 16)] * 3
    want = list(DataLoader(ds, batch_size=BATCH))  # dataset[i]: epoch 0, seed 0
    got = list(FastLoader(ds, batch_size=BATCH, num_workers=0, seed=0))
    assert_same(got, want)
    assert type(want[0]) is list and type(got[0][0]) is list  # [views], labels


@pytest.mark.parametrize("options", [{}, {"normalize": (MEAN, STD), "channels_last": True}])
def test_same_batches_for_any_num_workers(root, options):
    want = list(loader(root, 0, **options))
    assert_same(list(loader(root, 2, **options)), want)
    if options:
        assert want[0][0][0].dtype == torch.float32
        assert want[0][0][2].is_contiguous(memory_format=torch.channels_last)


@pytest.fixture(scope="module")
def tiny(image_folder) -> Path:
    """Two batches' worth of images: enough for the workers' share of them to matter."""
    return image_folder(num_classes=2, per_class=BATCH, size=((60, 90), (70, 100)), seed=32)


@pytest.mark.timeout(60)
@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on 2 cores
@pytest.mark.parametrize("num_workers", [1, 3])
def test_same_batches_with_one_or_three_workers(tiny, num_workers):
    """One worker makes every batch; three have one idle. The float ops (RandomErasing on the
    global views) run in the workers, drawn per view from (seed, epoch, index, view)."""
    options = {"normalize": (MEAN, STD), "channels_last": True}
    want = list(loader(tiny, 0, **options))
    assert len(want) == 2
    assert_same(list(loader(tiny, num_workers, **options)), want)


def test_float_ops_and_normalize_apply_to_every_view(root):
    plain = list(loader(root, 0, transform=dino(False), normalize=(MEAN, STD)))
    erased = list(loader(root, 0, transform=dino(True), normalize=(MEAN, STD)))
    mean, std = torch.tensor(MEAN)[:, None, None], torch.tensor(STD)[:, None, None]
    uint8 = list(loader(root, 0, transform=dino(False)))
    for (floats, _), (rows, _) in zip(plain, uint8):
        for f, r in zip(floats, rows):
            assert torch.allclose(f, (r.float() / 255 - mean) / std, atol=1e-5)
    assert any(not torch.equal(a[0], b[0]) for (a, _), (b, _) in zip(plain, erased))  # erasing ran
    assert all(torch.equal(a[2], b[2]) for (a, _), (b, _) in zip(plain, erased))  # locals have none


@pytest.mark.parametrize("k", [1, 2])
def test_resume_is_exact_mid_epoch(root, k):
    full = list(loader(root, 2))
    head, state = interrupted(loader(root, 2), k)
    assert_same(head, full[:k])
    resumed = loader(root, 2)
    resumed.load_state_dict(state)
    assert_same(list(resumed), full[k:])


def test_a_killed_worker_s_batches_rerun_byte_identical(root):
    want = list(loader(root, 0))
    fl = loader(root, 2, prefetch_factor=2)
    it = iter(fl)
    got = []
    for k, batch in enumerate(it):
        got.append(batch)
        if k == 1:
            os.kill(it.worker_pids[1], signal.SIGKILL)
    assert_same(got, want)
    assert it.worker_restarts == 1
    seen = sorted(i for _, labels in got for i in labels.tolist())
    assert seen == sorted(i for _, labels in want for i in labels.tolist())


def test_explain_shows_each_view_and_the_shared_decode(root):
    text = gpufeed.explain(loader(root, 0))
    assert "image fast path" in text.splitlines()[0]
    assert "views 0-1 (32x32): RandomResizedCrop(" in text
    assert "views 2-4 (16x16): RandomResizedCrop(" in text
    assert "one decode per sample" in text


def test_a_pipeline_that_does_not_translate_takes_the_generic_path(root):
    def user(image: Any) -> torch.Tensor:
        return torch.zeros(3, 8, 8)

    ds = ImageFolder(root, transform=MultiView([RandomResizedCrop(16), user]))
    images, _ = ds[0]
    assert [tuple(t.shape) for t in images] == [(3, 16, 16), (3, 8, 8)]
    with pytest.warns(GpufeedWarning, match="MultiView with a pipeline gpufeed does not translate.*view 1: "):
        fl = FastLoader(ds, batch_size=BATCH)
    assert fl.stats()["path"] == "generic"
    (first, _), *_ = list(fl)
    assert [tuple(t.shape) for t in first] == [(BATCH, 3, 16, 16), (BATCH, 3, 8, 8)]


def test_views_that_disagree_on_the_decode_are_refused():
    with pytest.raises(ValueError, match="decode backend: view 0 has None, view 1 has opencv"):
        MultiView([RandomResizedCrop(16), RandomResizedCrop(16, backend="opencv")])
    with pytest.raises(TypeError, match="view 0 must be"):
        MultiView([3])
    with pytest.raises(ValueError, match="at least one"):
        MultiView([])


def test_the_slot_bound_names_the_views(root):
    with pytest.raises(ValueError, match=r"views \(32, 32\) x 2, \(16, 16\) x 3"):
        FastLoader(ImageFolder(root, transform=dino()), batch_size=64, max_batch_bytes=1 << 16)


def test_an_encoded_cache_serves_later_epochs_the_same_batches(root):
    with warnings.catch_warnings():
        warnings.simplefilter("error", GpufeedWarning)
        fl = loader(root, 0, cache_bytes=64 << 20)
    first = [list(fl) for _ in range(2)]
    fresh = loader(root, 0)
    want = [list(fresh) for _ in range(2)]
    for got_epoch, want_epoch in zip(first, want):
        assert_same(got_epoch, want_epoch)
    assert fl.stats()["cache_hits"] > 0


def test_resize_center_crop_views_are_deterministic_and_equal_alone(root):
    views = MultiView([ResizeCenterCrop(48, 56), ResizeCenterCrop(24, 32)])
    assert views.deterministic
    data = files(root)[2]
    got = views.outputs(data, index=2)
    assert np.array_equal(got[1].numpy(), row(ResizeCenterCrop(24, 32), data, 2))
