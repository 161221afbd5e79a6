"""``benchmarks/serve.py --device cuda``: the option's defaults, its CUDA check and the GPU helpers.

The GPU serving goal: batched serving of ResNet-18 sustains at least 5x the offered rate that
batch-1 serving sustains (p99 under the SLO, >= 97% answered, < 1% refused). On a GPU the model
call is cheap for a batch and the per-request costs move to the host (decode, Python, kernel
launches), so the defaults there are sized for one H100/H200 host with 16 cores and for the
~150 s that ``make gpu-check`` gives this benchmark:

* batch-1: one handler thread per usable core, each: decode + crop, a pinned copy of the one
  image to the GPU, normalize + model there, and ``.cpu()`` of its logits (a sync: the answer
  exists on the host, as a server would send it);
* batcher / images: ``max_batch_size`` 64, ``max_delay_ms`` 5, ``cores - 4`` model threads
  (``max_concurrent_batches``) and, for ImageBatcher, as many decode workers, so that that many
  batches decode at once (one worker decodes one batch); results come back with ``.cpu()`` too;
* rates 0.25-16x batch-1's measured capacity, 1.5 s each; a mode stops after 2 consecutive rates it
  did not sustain; ``--budget-s`` (default 120) skips the points that would end after it;
  the closed-loop part is off (``--clients`` turns it on).

On CPU (the default ``--device cpu``) every default is the one serve.py always had.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch

from gpufeed.tune import usable_cores

# Goal of the highest sustained rate against batch-1's, per (device type, model); None: no goal.
GOALS = {("cpu", "smallcnn"): 1.2, ("cpu", "resnet18"): 1.0, ("cuda", "resnet18"): 5.0}


def cpu_defaults() -> dict[str, Any]:
    """serve.py's defaults without ``--device`` (unchanged from before the option existed)."""
    return {"models": ["smallcnn", "resnet18"], "rates": [0.5, 0.7, 0.85, 1.0, 1.2, 1.4], "duration": 3.0,
            "max_requests": 5000, "cores": min(2, os.cpu_count() or 1), "clients": 16, "image_workers": 1,
            "budget_s": None, "stop_after_fails": 0}


def cuda_defaults() -> dict[str, Any]:
    """Defaults with ``--device cuda`` (see the module docstring)."""
    cores = usable_cores()
    threads = max(2, cores - 4)
    return {"models": ["resnet18"], "rates": [0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0], "duration": 1.5,
            "max_requests": 40000, "cores": cores, "clients": 0, "image_workers": threads,
            "max_batch_size": 64, "max_delay_ms": 5.0, "max_concurrent_batches": threads,
            "budget_s": 120.0, "stop_after_fails": 2}


def resolve(args: argparse.Namespace) -> str | None:
    """Fill the options left at None with the device's defaults; the one-line error when
    ``--device`` names a CUDA device this machine does not have, else None."""
    try:
        device = torch.device(args.device)
    except (RuntimeError, ValueError):
        return f"serve.py: --device must be cpu or cuda[:N]. Found: {args.device!r}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return (f"serve.py: --device {args.device}: no CUDA here (torch {torch.__version__}, built with CUDA "
                    f"{torch.version.cuda}, reports torch.cuda.is_available() False); run it on a machine with "
                    "an NVIDIA GPU (make gpu-check), or leave --device at cpu")
        if device.index is not None and device.index >= torch.cuda.device_count():
            return (f"serve.py: --device {args.device}: this machine has {torch.cuda.device_count()} CUDA "
                    "device(s); pick one of them")
    elif device.type != "cpu":
        return f"serve.py: --device must be cpu or cuda[:N]. Found: {args.device!r}"
    defaults = cuda_defaults() if device.type == "cuda" else cpu_defaults()
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.torch_device = device
    return None


def describe(device: torch.device) -> str:
    """The device in words, for the first line of the output."""
    if device.type != "cuda":
        return "cpu"
    p = torch.cuda.get_device_properties(device)
    return f"{device} ({p.name}, {p.total_memory / 2**30:.0f} GiB; torch CUDA {torch.version.cuda})"


class HostResult:
    """Wraps a model for ImageBatcher on a GPU: the logits come back to the host (``.cpu()``),
    so a future settles when its answer exists, not when the kernels were queued."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x).cpu()


def warm_up(run: Any, sample: torch.Tensor, sizes: list[int]) -> None:
    """Call ``run`` on batches of each size once (cuDNN/cuBLAS handles and kernels chosen
    before any clock starts)."""
    for n in sorted(set(sizes)):
        run([sample] * n)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
