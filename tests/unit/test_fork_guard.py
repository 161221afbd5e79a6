"""What the loader's main process does around forking a worker: OpenCV at one thread (every
loader) and, for a fast path, libturbojpeg loaded first so that the workers inherit it."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.decoders import _backends
from gpufeed.image._cv2threads import fast_path_fork_guard, single_threaded_cv2
from gpufeed.synth import make_image_folder


def test_the_fast_path_guard_loads_libturbojpeg_in_this_process():
    saved = _backends._turbo
    try:
        _backends.set_turbo_state(None)
        with fast_path_fork_guard():
            assert _backends._turbo is not None  # loaded (or found missing) before the fork
    finally:
        _backends.set_turbo_state(saved)


def test_fast_path_loaders_use_it_and_the_generic_path_does_not(tmp_path):
    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(16, 16))
    images = ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 16))
    fast = FastLoader(images, batch_size=2, num_workers=1)
    generic = FastLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2, num_workers=1)
    try:
        assert fast._engine_context().fork_guard is fast_path_fork_guard
        assert generic._engine_context().fork_guard is single_threaded_cv2
    finally:
        fast.close()
        generic.close()
