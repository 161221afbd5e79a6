"""Deciding whether a loader takes the image fast path, and building its plan and feed."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch.utils.data._utils.collate import default_collate

from gpufeed._image.fill import ImageFeed, ImagePlan
from gpufeed.cache import HostCache
from gpufeed.cuda import GpuTransform


def _image_options_given(channels_last, normalize, dtype, on_error, cache_budget, seed) -> list[str]:
    given = []
    for name, value, default in (
        ("channels_last", channels_last, False),
        ("normalize", normalize, None),
        ("dtype", dtype, None),
        ("on_error", on_error, "raise"),
        ("cache_bytes", cache_budget, 0),
        ("seed", seed, None),
    ):
        if value != default:
            given.append(name)
    return given


def fast_path_blocker(loader: Any) -> str | None:
    """Why ``loader`` cannot take the image fast path, or None if it can."""
    from gpufeed.sources import ImageSource

    dataset = loader.dataset
    if not isinstance(dataset, ImageSource):
        return f"the dataset is a {type(dataset).__name__}, not a gpufeed image dataset"
    if dataset.transform is None:
        return "the image dataset has no transform (images of different sizes cannot be batched)"
    if loader.batch_sampler is None:
        return "batch_size=None disables batching"
    if loader.collate_fn is not default_collate:
        return "a custom collate_fn is used"
    return None


def make_image_feed(
    loader: Any,
    *,
    channels_last: bool,
    normalize: tuple[Sequence[float], Sequence[float]] | None,
    dtype: torch.dtype | None,
    on_error: str,
    cache_budget: int,
    seed: int | None,
    on_gpu: bool = False,
) -> ImageFeed | None:
    """The loader's ImageFeed, or None for the generic path (where image options are errors).

    ``on_gpu``: uint8 crosses PCIe and dtype/normalize run on the GPU (``feed.gpu_transform``).
    """
    blocker = fast_path_blocker(loader)
    if blocker is not None:
        given = _image_options_given(channels_last, normalize, dtype, on_error, cache_budget, seed)
        if given:
            raise ValueError(
                f"{', '.join(f'`{g}`' for g in given)} only apply to the image fast path, which this "
                f"loader cannot take: {blocker}. Use gpufeed.ImageFolder / ImageDataset / LMDBDataset "
                "with a transform and the default collate_fn, or drop these options."
            )
        return None
    if normalize is not None:
        mean, std = normalize
        normalize = (tuple(float(m) for m in mean), tuple(float(s) for s in std))
    if dtype is None:
        dtype = torch.float32 if normalize is not None else torch.uint8
    transform = loader.dataset.transform
    if seed is None:
        seed = transform.seed if transform.seed is not None else _default_seed(loader.generator)
    gpu_transform = GpuTransform(dtype, normalize, bool(channels_last)) if on_gpu else None
    plan = ImagePlan(
        transform=transform,
        channels_last=bool(channels_last),
        on_error=on_error,
        normalize=None if on_gpu else normalize,
        dtype=torch.uint8 if on_gpu else dtype,
        seed=int(seed),
        cache=None if cache_budget == 0 else ("decoded" if transform.deterministic else "encoded"),
    )
    batch = loader.batch_size or 1
    need = plan.offsets(batch)[2]
    if need > loader.engine_config.max_batch_bytes:
        raise ValueError(
            f"a batch of {batch} images of {plan.hw} ({dtype}) needs {need} bytes of arena slot; "
            f"`max_batch_bytes` is {loader.engine_config.max_batch_bytes}. Raise max_batch_bytes "
            "or lower batch_size."
        )
    cache = HostCache(cache_budget) if cache_budget else None
    return ImageFeed(plan, loader.dataset, cache, gpu_transform)


def _default_seed(generator: torch.Generator | None) -> int:
    # initial_seed() does not advance the generator, so sampling order is unaffected.
    return (generator.initial_seed() if generator is not None else torch.initial_seed()) % (1 << 63)
