"""CUDA feed benchmark: a real training step fed three ways, and a feed-only mode.

    python -m benchmarks.cuda_feed [--mode train,feed] [--batch-size 256] [--workers N] [--json OUT]
    python -m benchmarks.cuda_feed --cpu-dry-run      # the same code paths on CPU, tiny sizes

Three feeds, the same images in the same order, the same normalize and layout (float32,
channels_last, ImageNet mean/std):

  a  FastLoader(device="cuda", normalize=..., channels_last=True): uint8 crosses PCIe on the
     loader's copy stream, normalize and layout run on the GPU
  b  DataLoader(pin_memory=True) + .to("cuda", non_blocking=True) + normalize on the GPU
  c  FastLoader(pin_memory=True) + .to("cuda", non_blocking=True) + normalize on the GPU

train mode: torchvision ResNet-50 (random weights), channels_last, bf16 autocast, SGD, on demo
JPEGs made once at 224x224 (``gpufeed.synth.make_image_folder``). Per feed: step time,
images/s, data-wait fraction (GPU time between the end of one step and the moment the next
batch is ready on the step's stream, over the step's GPU time, from CUDA events), and copy/compute
overlap from torch.profiler (share of host-to-device memcpy time during which a compute kernel
ran). feed mode: synthetic uint8 batches, no model: batches/s, and the bandwidth of the feed's
host-to-device copies measured per copy (bytes over each copy's own GPU time: CUDA events
in the loader's stats, and the profiler's memcpy records) against the device's pinned bandwidth
(one pinned tensor copied the same way: ``.to(non_blocking=True)`` on a side stream, CUDA events).

Goals on a GPU: data wait (a) < 5% when the CPU side keeps up; >= 90% of (a)'s H2D time overlapped
with compute; per-copy bandwidth >= 80% of pinned; (a)'s step time within 3% of (b)'s or faster.
``--variants`` runs (a) once more per variant of how its CUDA feed guards device memory the
consumer may still read (the copy stream waiting on the consumer's or not; ``record_stream`` or
references kept until an event passes), side by side, each with its overlap figure
(``VARIANTS``; docs/design/cuda-feed.md says which figure decides).
``--cpu-dry-run`` runs every code path on CPU with tiny sizes; CUDA events, the profiler's GPU
records and the bandwidth are replaced by stand-ins labelled "CPU stand-in", never reported as
GPU figures, and no goal is judged.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
from gpufeed.compare import SyntheticImageDataset, describe_environment, format_bytes
from gpufeed.synth import make_image_folder

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
FEEDS = {
    "a": "FastLoader(device=cuda)",
    "b": "DataLoader(pin_memory)+.to",
    "c": "FastLoader(pin_memory)+.to",
}
DRY_FEEDS = {  # what the same code runs on CPU: no device, nothing page-locked
    "a": "FastLoader, no device (stand-in)",
    "b": "DataLoader+.to(cpu) (stand-in)",
    "c": "FastLoader+.to(cpu) (stand-in)",
}
# How feed (a)'s CudaFeed guards device memory the consumer may still read (a private option of
# the feed, docs/design/cuda-feed.md "Guarding device memory"): (wait_on_consumer, keep_references).
# --variants runs (a) once per variant, side by side; a variant's feed is named "a[VARIANT]".
VARIANTS = {
    "wait+record_stream": (True, False),  # the default: the copy stream waits on the consumer's
    "nowait+record_stream": (False, False),
    "wait+keep": (True, True),  # references kept until an event passes, instead of record_stream
    "nowait+keep": (False, True),
}
DEFAULT_VARIANT = "wait+record_stream"
GOAL_DATA_WAIT = 0.05
GOAL_OVERLAP = 0.90
GOAL_BANDWIDTH = 0.80
GOAL_STEP_RATIO = 1.03
STAND_IN = "CPU stand-in"


# --------------------------------------------------------------------------------------------
# Clocks: CUDA events on a GPU; host marks at the same points on CPU (labelled stand-ins)
# --------------------------------------------------------------------------------------------


class HostMark:
    """CPU stand-in for a CUDA event: ``record()`` reads the host clock (CPU work is synchronous)."""

    def __init__(self) -> None:
        self.t_s = 0.0

    def record(self, stream: Any = None) -> None:
        self.t_s = time.perf_counter()

    def elapsed_time(self, end: HostMark) -> float:
        return (end.t_s - self.t_s) * 1000.0


@dataclass(frozen=True)
class StepTimer:
    """Where timings come from: CUDA events on ``device``, else host marks (a labelled stand-in)."""

    device: torch.device

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    @property
    def source(self) -> str:
        return "CUDA events" if self.on_gpu else f"{STAND_IN}: host perf_counter at the same points"

    def mark(self) -> Any:
        """A recorded mark on the current stream."""
        m: Any = torch.cuda.Event(enable_timing=True) if self.on_gpu else HostMark()
        m.record()
        return m

    def sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize(self.device)


# --------------------------------------------------------------------------------------------
# Copy/compute overlap from a profiler trace (chrome trace JSON: pure arithmetic, tested on CPU)
# --------------------------------------------------------------------------------------------


def merge_intervals(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def covered(merged: list[tuple[float, float]], start: float, end: float) -> float:
    """How much of ``[start, end)`` the disjoint sorted intervals ``merged`` cover."""
    i = max(0, bisect.bisect_right(merged, (start, float("inf"))) - 1)
    total = 0.0
    while i < len(merged) and merged[i][0] < end:
        total += max(0.0, min(end, merged[i][1]) - max(start, merged[i][0]))
        i += 1
    return total


def is_gpu_h2d(event: dict) -> bool:
    return event.get("cat") == "gpu_memcpy" and "HtoD" in str(event.get("name", ""))


def is_gpu_kernel(event: dict) -> bool:
    return event.get("cat") == "kernel"


def is_cpu_copy(event: dict) -> bool:  # CPU stand-in for the dry run
    return event.get("cat") == "cpu_op" and event.get("name") == "aten::copy_"


def is_cpu_compute(event: dict) -> bool:  # CPU stand-in for the dry run
    name = str(event.get("name", ""))
    return event.get("cat") == "cpu_op" and (name.startswith("aten::mkldnn_convolution")
                                             or name == "aten::convolution_backward")


def overlap_report(
    events: list[dict],
    is_copy: Callable[[dict], bool] = is_gpu_h2d,
    is_compute: Callable[[dict], bool] = is_gpu_kernel,
    min_copy_bytes: int = 1 << 20,
) -> dict[str, Any]:
    """Share of copy time during which some compute event ran, from chrome-trace events.

    Also counts pinned and pageable host-to-device copies (a pageable one means the host batch
    was not page-locked) and the median per-copy bandwidth of copies of ``min_copy_bytes`` or more
    (bytes over the copy's own device duration).
    """
    copies = [e for e in events if is_copy(e) and float(e.get("dur", 0)) > 0]
    compute = merge_intervals([(float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                               for e in events if is_compute(e) and float(e.get("dur", 0)) > 0])
    copy_us = sum(float(e["dur"]) for e in copies)
    overlapped_us = sum(covered(compute, float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in copies)
    per_copy_gbps = [
        float(e["args"]["bytes"]) / (float(e["dur"]) * 1e3)
        for e in copies
        if isinstance(e.get("args"), dict) and float(e["args"].get("bytes", 0)) >= min_copy_bytes
    ]
    names = [str(e.get("name", "")) for e in copies]
    return {
        "copies": len(copies),
        "pinned_copies": sum("Pinned" in n for n in names),
        "pageable_copies": sum("Pageable" in n for n in names),
        "compute_events": sum(1 for e in events if is_compute(e)),
        "copy_ms": copy_us / 1e3,
        "overlapped_ms": overlapped_us / 1e3,
        "overlap_share": overlapped_us / copy_us if copy_us > 0 else None,
        "per_copy_gbps_median": statistics.median(per_copy_gbps) if per_copy_gbps else None,
        "large_copies": len(per_copy_gbps),
    }


def profile_trace(fn: Callable[[], None], on_gpu: bool) -> list[dict]:
    """Run ``fn`` under torch.profiler (CPU, and CUDA on a GPU) and return the trace's events."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as prof:
        fn()
    with tempfile.TemporaryDirectory(prefix="gpufeed-trace-") as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]


def profiled_overlap(fn: Callable[[], None], clock: StepTimer) -> dict[str, Any]:
    """:func:`overlap_report` of ``fn`` run under the profiler; ``{"error": ...}`` if profiling failed."""
    try:
        events = profile_trace(fn, clock.on_gpu)
    except Exception as exc:  # noqa: BLE001 - e.g. CUPTI unavailable: the other figures still count
        return {"error": describe_error(exc), "overlap_share": None}
    return overlap_of(events, clock.on_gpu)


def describe_error(exc: BaseException) -> str:
    import traceback

    where = traceback.extract_tb(exc.__traceback__)[-1:]
    at = f" at {Path(where[0].filename).name}:{where[0].lineno}" if where else ""
    return f"{type(exc).__name__}: {exc}{at}"


def overlap_of(events: list[dict], on_gpu: bool) -> dict[str, Any]:
    if on_gpu:
        report = overlap_report(events)
        report["source"] = "torch.profiler: gpu_memcpy HtoD vs kernel records"
    else:
        report = overlap_report(events, is_cpu_copy, is_cpu_compute, min_copy_bytes=1 << 62)
        report["source"] = f"{STAND_IN}: aten::copy_ vs convolution CPU ops (not a GPU figure)"
    return report


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


class SmallResNet(nn.Module):
    """A small ResNet-like model for the CPU dry run (torchvision is not needed there)."""

    def __init__(self, num_classes: int = 1000, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.block = nn.Sequential(nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                                   nn.Conv2d(width, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width))
        self.head = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = F.relu(x + self.block(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def build_model(name: str, device: torch.device) -> tuple[nn.Module, str]:
    """The model and a line saying which one it is."""
    if name == "resnet50":
        try:
            from torchvision.models import resnet50  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            model: nn.Module = SmallResNet()
            note = (f"SmallResNet (this script's stand-in): torchvision is not importable ({exc}); "
                    f"figures are NOT ResNet-50's")
        else:
            model, note = resnet50(), "torchvision resnet50 (random weights)"
    else:
        model, note = SmallResNet(), "SmallResNet (this script's stand-in, --model small)"
    return model.to(device).to(memory_format=torch.channels_last), note  # type: ignore[call-overload]


def make_train_step(model: nn.Module, device: torch.device) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """One SGD step: bf16 autocast forward, cross-entropy, backward, update (nothing read back)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


# --------------------------------------------------------------------------------------------
# Feeds
# --------------------------------------------------------------------------------------------


@dataclass
class Setup:
    device: torch.device  # cuda, or cpu for the dry run
    batch_size: int
    workers: int
    prefetch_factor: int
    cache_bytes: Any = None
    scale_shift: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """What a user of (b) and (c) writes: uint8 NCHW on the device -> float32 channels_last,
        ``(x / 255 - mean) / std``."""
        if self.device not in self.scale_shift:
            mean, std = torch.tensor(MEAN), torch.tensor(STD)
            self.scale_shift[self.device] = ((1.0 / (255.0 * std)).view(1, 3, 1, 1).to(self.device),
                                             (-mean / std).view(1, 3, 1, 1).to(self.device))
        scale, shift = self.scale_shift[self.device]
        x = x.contiguous(memory_format=torch.channels_last).to(torch.float32)
        return x.mul_(scale).add_(shift)


@dataclass
class OpenFeed:
    """A feed's batches (ready on the current stream) and the loader behind them."""

    batches: Iterator[Any]
    loader: Any

    def close(self) -> None:
        close = getattr(self.batches, "close", None)
        if close is not None:
            close()
        self.batches = iter(())
        if isinstance(self.loader, FastLoader):
            self.loader.close()
        self.loader = None


def _moved(loader: Any, setup: Setup, images: bool) -> Iterator[Any]:
    """(b) and (c): the user's copy (non_blocking from page-locked memory) and GPU normalize."""
    dev = setup.device
    for batch in loader:
        if images:
            x, y = batch
            x = setup.normalize(x.to(dev, non_blocking=True))
            yield x, y.to(dev, non_blocking=True)
        else:
            yield batch.to(dev, non_blocking=True)


def split_feed(name: str) -> tuple[str, str]:
    """``"a[nowait+keep]"`` -> ``("a", "nowait+keep")``; a plain name has the default variant."""
    base, _, rest = name.partition("[")
    return base, rest.rstrip("]") if rest else DEFAULT_VARIANT


def feed_label(name: str, on_gpu: bool) -> str:
    base, variant = split_feed(name)
    label = (FEEDS if on_gpu else DRY_FEEDS)[base]
    if name == base:
        return label
    return label if on_gpu else f"{label}, no effect without a device"  # the name says the variant


def set_feed_variant(loader: FastLoader, variant: str) -> None:
    """Give ``loader``'s CudaFeed the guard ``variant`` (a private option, measured only here): the
    feed is made before ``iter`` (``iter`` reuses it). Without a device there is no feed."""
    loader._engine_context()  # noqa: SLF001 - the private option this benchmark exists to measure
    feed = loader._cuda_feed  # noqa: SLF001
    if feed is not None:
        feed.wait_on_consumer, feed.keep_references = VARIANTS[variant]


def open_feed(name: str, dataset: Any, sampler: list[int], setup: Setup, images: bool) -> OpenFeed:
    """Feed ``name`` over ``dataset`` in ``sampler``'s order. On CPU (dry run), (a) is the same
    FastLoader without ``device`` (a stand-in) and nothing is page-locked."""
    common: dict[str, Any] = dict(batch_size=setup.batch_size, sampler=sampler, num_workers=setup.workers,
                                  prefetch_factor=setup.prefetch_factor)
    gpu = setup.on_gpu
    base, variant = split_feed(name)
    if base == "a":
        kw: dict[str, Any] = {}
        if images:
            kw = dict(normalize=(MEAN, STD), channels_last=True, cache_bytes=setup.cache_bytes)
        loader: Any = FastLoader(dataset, **common, device=setup.device if gpu else None, **kw)
        if variant != DEFAULT_VARIANT:
            set_feed_variant(loader, variant)
        return OpenFeed(iter(loader), loader)
    if name == "b":
        loader = DataLoader(dataset, **common, pin_memory=gpu)
        return OpenFeed(_moved(loader, setup, images), loader)
    if name == "c":
        kw = dict(cache_bytes=setup.cache_bytes) if images else {}
        loader = FastLoader(dataset, **common, pin_memory=gpu, **kw)
        return OpenFeed(_moved(loader, setup, images), loader)
    raise ValueError(f"unknown feed {name!r}; expected one of {sorted(FEEDS)}")


# --------------------------------------------------------------------------------------------
# train mode
# --------------------------------------------------------------------------------------------


def run_train_feed(
    name: str, dataset: Any, setup: Setup, step: Callable[..., None], clock: StepTimer, *,
    steps: int, warmup: int, profile_steps: int,
) -> dict[str, Any]:
    """Warm-up steps, timed steps (marks around each batch fetch and step), profiled steps."""
    total = (warmup + steps + profile_steps + 1) * setup.batch_size
    sampler = [i % len(dataset) for i in range(total)]
    t_open = time.perf_counter()
    feed = open_feed(name, dataset, sampler, setup, images=True)
    try:
        it = feed.batches
        x, y = next(it)
        startup_s = time.perf_counter() - t_open
        first = (x[:4].float().cpu(), y[:4].cpu())
        step(x, y)
        for _ in range(warmup - 1):
            step(*next(it))
        clock.sync()
        marks = []
        host_wait_s = 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            m0 = clock.mark()
            h0 = time.perf_counter()
            x, y = next(it)
            host_wait_s += time.perf_counter() - h0
            m1 = clock.mark()
            step(x, y)
            marks.append((m0, m1, clock.mark()))
        clock.sync()
        wall_s = time.perf_counter() - t0

        def profiled() -> None:
            for _ in range(profile_steps):
                step(*next(it))
            clock.sync()

        overlap = profiled_overlap(profiled, clock) if profile_steps else None
        loader_stats = feed.loader.stats() if isinstance(feed.loader, FastLoader) else {}
    finally:
        feed.close()
    wait_ms = [m0.elapsed_time(m1) for m0, m1, _ in marks]
    step_ms = [m0.elapsed_time(m2) for m0, _, m2 in marks]
    return {
        "feed": name,
        "label": feed_label(name, clock.on_gpu),
        "steps": steps,
        "wall_step_ms": wall_s / steps * 1000.0,
        "images_per_s": steps * setup.batch_size / wall_s,
        "data_wait_fraction": sum(wait_ms) / sum(step_ms) if sum(step_ms) > 0 else None,
        "marked_step_ms_median": statistics.median(step_ms),
        "data_wait_ms_median": statistics.median(wait_ms),
        "host_wait_fraction": host_wait_s / wall_s,
        "startup_s": startup_s,
        "overlap": overlap,
        "loader_stats": {k: v for k, v in loader_stats.items() if isinstance(v, (int, float))},
        "_first": first,
    }


def compute_only(step: Callable[..., None], setup: Setup, size: int, clock: StepTimer, steps: int) -> float:
    """Median step time (ms) with one batch already resident: the floor no feed can beat."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (setup.batch_size, 3, size, size), dtype=torch.uint8, generator=g)
    x = setup.normalize(x.to(setup.device))
    y = torch.randint(0, 1000, (setup.batch_size,), generator=g).to(setup.device)
    for _ in range(3):
        step(x, y)
    clock.sync()
    times = []
    for _ in range(steps):
        m0 = clock.mark()
        step(x, y)
        times.append((m0, clock.mark()))
    clock.sync()
    return statistics.median(a.elapsed_time(b) for a, b in times)


def prepare_images(root: Path, count: int, size: int) -> tuple[Path, int, bool]:
    """``count`` photo-like JPEGs of ``size`` x ``size`` in 8 classes under ``root`` (made once)."""
    marker = root / f".complete-{count}-{size}"
    if marker.exists():
        return root, count, True
    per_class = max(1, count // 8)
    made = make_image_folder(root, num_classes=8, per_class=per_class, size=(size, size), seed=0)
    marker.touch()
    return root, made.num_images, False


def train_mode(args: argparse.Namespace, setup: Setup, clock: StepTimer, log: Callable[[str], None]) -> dict[str, Any]:
    t = time.perf_counter()
    root, count, reused = prepare_images(Path(args.data_dir), args.images, args.image_size)
    log(f"images: {'reused' if reused else 'made'} {count} JPEGs of {args.image_size}x{args.image_size} "
        f"in {root} ({time.perf_counter() - t:.1f} s)")
    dataset = ImageFolder(root, transform=ResizeCenterCrop(args.image_size, args.image_size))
    model, model_note = build_model(args.model, setup.device)
    log(f"model: {model_note}; channels_last, bf16 autocast, SGD(momentum=0.9)")
    if clock.on_gpu:
        torch.backends.cudnn.benchmark = True
    step = make_train_step(model, setup.device)
    floor_ms = compute_only(step, setup, args.image_size, clock, max(3, args.steps // 3))
    log(f"compute only (batch resident on the device): {floor_ms:.2f} ms/step ({clock.source})")
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in args.feeds}
    errors: dict[str, str] = {}
    round_s = 0.0
    for r in range(args.rounds):
        if r and time.perf_counter() + round_s > args.deadline:
            log(f"  budget: round {r + 1} and later skipped (a round takes ~{round_s:.0f} s; --budget-s)")
            break
        t_round = time.perf_counter()
        order = args.feeds[r % len(args.feeds):] + args.feeds[:r % len(args.feeds)]
        for name in order:
            if name in errors:
                continue
            try:
                res = run_train_feed(name, dataset, setup, step, clock, steps=args.steps, warmup=args.warmup,
                                     profile_steps=args.profile_steps if r == 0 else 0)
            except Exception as exc:  # noqa: BLE001 - one broken feed must not hide the others' figures
                errors[name] = describe_error(exc)
                log(f"  round {r + 1} {name}: FAILED: {errors[name]}")
                continue
            rounds[name].append(res)
            ov = res["overlap"]
            ov_text = "" if ov is None else f", overlap {_pct(ov.get('overlap_share'))}"
            log(f"  round {r + 1} {name} {res['label']}: {res['wall_step_ms']:.2f} ms/step, "
                f"{res['images_per_s']:.0f} images/s, data wait {_pct(res['data_wait_fraction'])}{ov_text}")
        round_s = time.perf_counter() - t_round
    # The same images in the same order: the first rows of every feed's first batch agree.
    ran = [name for name in args.feeds if rounds[name]]
    mismatch = []
    if ran:
        ref_x, ref_y = rounds[ran[0]][0]["_first"]
        for name in ran:
            for res in rounds[name]:
                x, y = res.pop("_first")
                diff = float((x - ref_x).abs().max())
                if diff > 1e-4 or not torch.equal(y, ref_y):
                    mismatch.append(f"{name}: max |x - x_{ran[0]}| = {diff:.3g}, labels equal {torch.equal(y, ref_y)}")
    summary = {}
    for name in ran:
        runs = rounds[name]
        summary[name] = {
            "label": runs[0]["label"],
            "wall_step_ms": statistics.median(r["wall_step_ms"] for r in runs),
            "images_per_s": statistics.median(r["images_per_s"] for r in runs),
            "data_wait_fraction": statistics.median(r["data_wait_fraction"] for r in runs),
            "host_wait_fraction": statistics.median(r["host_wait_fraction"] for r in runs),
            "overlap": runs[0]["overlap"],
            "rounds": runs,
        }
    return {"compute_only_step_ms": floor_ms, "model": model_note, "feeds": summary, "batch_mismatch": mismatch,
            "errors": errors, "images": count, "image_size": args.image_size}


# --------------------------------------------------------------------------------------------
# feed mode
# --------------------------------------------------------------------------------------------


def pinned_bandwidth(nbytes: int, setup: Setup, clock: StepTimer, reps: int) -> dict[str, Any]:
    """One page-locked tensor copied like the feed copies (``.to(non_blocking=True)`` on a side
    stream), each copy between CUDA events; on CPU a host memcpy (a stand-in)."""
    if not clock.on_gpu:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.empty_like(src)
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t)
        return {"bytes": nbytes, "gbps": nbytes / statistics.median(times) / 1e9,
                "source": f"{STAND_IN}: host memcpy (not a GPU figure)"}
    src = torch.ones(nbytes, dtype=torch.uint8).pin_memory()
    stream = torch.cuda.Stream(setup.device)
    times_ms = []
    with torch.cuda.stream(stream):
        for i in range(reps + 2):
            m0 = clock.mark()
            dst = src.to(setup.device, non_blocking=True)
            m1 = clock.mark()
            if i >= 2:  # two warm-up copies
                times_ms.append((m0, m1))
            del dst
    torch.cuda.synchronize(setup.device)
    ms = statistics.median(a.elapsed_time(b) for a, b in times_ms)
    return {"bytes": nbytes, "gbps": nbytes / (ms * 1e6), "source": "pinned tensor, CUDA events"}


def run_feed_only(name: str, setup: Setup, clock: StepTimer, shape: tuple[int, ...], *,
                  batches: int, warmup: int, profile_batches: int) -> dict[str, Any]:
    """Iterate ``batches`` synthetic batches (no model); time the steady state, profile a few."""
    dataset = SyntheticImageDataset(batches * setup.batch_size, shape)
    sampler = list(range(len(dataset)))
    batch_bytes = setup.batch_size * int(torch.tensor(shape).prod())
    feed = open_feed(name, dataset, sampler, setup, images=False)
    try:
        it = feed.batches
        for _ in range(warmup):
            next(it)
        clock.sync()
        timed = batches - warmup - profile_batches
        t0 = time.perf_counter()
        for _ in range(timed):
            next(it)
        clock.sync()
        wall_s = time.perf_counter() - t0

        def profiled() -> None:
            for _ in range(profile_batches):
                next(it)
            clock.sync()

        profile = profiled_overlap(profiled, clock) if profile_batches else None
        for _ in it:  # to the end: the feed's last copies are retired and counted in its stats
            pass
        stats = feed.loader.stats() if isinstance(feed.loader, FastLoader) else {}
    finally:
        feed.close()
    h2d_s = float(stats.get("h2d_s", 0.0) or 0.0)
    event_gbps = batches * batch_bytes / h2d_s / 1e9 if (name == "a" and clock.on_gpu and h2d_s > 0) else None
    return {
        "feed": name,
        "label": feed_label(name, clock.on_gpu),
        "batches_per_s": timed / wall_s,
        "batch_bytes": batch_bytes,
        "per_copy_gbps_events": event_gbps,
        "h2d_s": h2d_s,
        "profile": profile,
    }


def feed_mode(args: argparse.Namespace, setup: Setup, clock: StepTimer, log: Callable[[str], None]) -> dict[str, Any]:
    shape = (3, args.image_size, args.image_size)
    batch_bytes = setup.batch_size * args.image_size * args.image_size * 3
    large_bytes = max(batch_bytes, 256 << 20) if clock.on_gpu else 4 * batch_bytes
    errors: dict[str, str] = {}
    ref: dict[str, Any] | None
    big: dict[str, Any] | None
    try:
        ref = pinned_bandwidth(batch_bytes, setup, clock, reps=args.bandwidth_reps)
        big = pinned_bandwidth(large_bytes, setup, clock, reps=max(3, args.bandwidth_reps // 4))
        log(f"  pinned reference: {ref['gbps']:.1f} GB/s for {format_bytes(ref['bytes'])}, "
            f"{big['gbps']:.1f} GB/s for {format_bytes(big['bytes'])} ({ref['source']})")
    except Exception as exc:  # noqa: BLE001
        errors["pinned"] = describe_error(exc)
        ref = big = None
        log(f"  pinned reference: FAILED: {errors['pinned']}")
    results = {}
    for name in args.feeds:
        try:
            res = run_feed_only(name, setup, clock, shape, batches=args.feed_batches, warmup=args.warmup,
                                profile_batches=args.profile_steps)
        except Exception as exc:  # noqa: BLE001 - one broken feed must not hide the others' figures
            errors[name] = describe_error(exc)
            log(f"  feed {name}: FAILED: {errors[name]}")
            continue
        results[name] = res
        per_copy = res["per_copy_gbps_events"]
        prof = res["profile"] or {}
        log(f"  feed {name} {res['label']}: {res['batches_per_s']:.1f} batches/s; per-copy H2D "
            f"{_gbps(per_copy)} (CUDA events), {_gbps(prof.get('per_copy_gbps_median'))} (profiler, "
            f"{prof.get('pinned_copies', 0)} pinned / {prof.get('pageable_copies', 0)} pageable)")
    return {"feeds": results, "pinned": ref, "pinned_large": big, "errors": errors}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100.0 * x:.1f}%"


def _gbps(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f} GB/s"


def judge(train: dict[str, Any] | None, feed: dict[str, Any] | None) -> list[tuple[str, bool | None, str]]:
    """The four goals: (goal, met, or None when it cannot be judged, the evidence)."""
    a = (train or {}).get("feeds", {}).get("a")
    b = (train or {}).get("feeds", {}).get("b")
    fa = (feed or {}).get("feeds", {}).get("a")
    pinned = (feed or {}).get("pinned")
    missing = "not measured (mode not run, or the feed failed)"
    goals: list[tuple[str, bool | None, str]] = []

    name = f"data wait of (a) < {GOAL_DATA_WAIT:.0%} of step time"
    if a is None:
        goals.append((name, None, missing))
    else:
        kept_up = a["host_wait_fraction"] < GOAL_DATA_WAIT
        wait = a["data_wait_fraction"]
        goals.append((name, (wait < GOAL_DATA_WAIT) if kept_up else None,
                      f"{_pct(wait)}; the host waited in next() {_pct(a['host_wait_fraction'])} of wall time"
                      + ("" if kept_up else ": the CPU side did not keep up, not judged")))

    name = f">= {GOAL_OVERLAP:.0%} of (a)'s H2D copy time overlapped with compute"
    overlap = (a or {}).get("overlap") or {}
    share = overlap.get("overlap_share")
    if share is None:
        goals.append((name, None, missing if a is None else overlap.get("error", "no H2D copies in the profile")))
    else:
        goals.append((name, share >= GOAL_OVERLAP, f"{_pct(share)} of {overlap['copy_ms']:.2f} ms of copies "
                      f"({overlap['copies']} copies, {overlap['compute_events']} kernels profiled)"))

    name = f"per-copy H2D bandwidth of (a) >= {GOAL_BANDWIDTH:.0%} of pinned"
    per_copy, source = (fa or {}).get("per_copy_gbps_events"), "CUDA events of each copy, loader stats h2d_s"
    if per_copy is None:  # the loader's stats lack h2d_s: the profiler's records of the same copies
        per_copy, source = ((fa or {}).get("profile") or {}).get("per_copy_gbps_median"), "profiler, median copy"
    if per_copy is None or pinned is None:
        goals.append((name, None, missing))
    else:
        goals.append((name, per_copy >= GOAL_BANDWIDTH * pinned["gbps"],
                      f"{per_copy:.1f} GB/s ({source}) vs {pinned['gbps']:.1f} GB/s pinned "
                      f"({per_copy / pinned['gbps']:.0%})"))

    name = f"step time of (a) <= {GOAL_STEP_RATIO:.2f}x (b)'s"
    if a is None or b is None:
        goals.append((name, None, missing))
    else:
        ratio = a["wall_step_ms"] / b["wall_step_ms"]
        goals.append((name, ratio <= GOAL_STEP_RATIO,
                      f"{ratio:.3f}x ({a['wall_step_ms']:.2f} vs {b['wall_step_ms']:.2f} ms/step)"))
    return goals


def format_train_table(train: dict[str, Any]) -> str:
    rows = [f"{'feed':<36}{'ms/step':>9}{'images/s':>10}{'data wait':>11}{'host wait':>11}{'H2D overlap':>13}"
            f"{'H2D pinned/pageable':>21}"]
    for name, s in train["feeds"].items():
        ov = s["overlap"] or {}
        rows.append(f"{name + ' ' + s['label']:<36}{s['wall_step_ms']:>9.2f}{s['images_per_s']:>10.0f}"
                    f"{_pct(s['data_wait_fraction']):>11}{_pct(s['host_wait_fraction']):>11}"
                    f"{_pct(ov.get('overlap_share')):>13}"
                    f"{str(ov.get('pinned_copies', '-')) + '/' + str(ov.get('pageable_copies', '-')):>21}")
    return "\n".join(rows)


def variants_summary(train: dict[str, Any] | None, feed: dict[str, Any] | None,
                     variants: list[str]) -> dict[str, dict[str, Any]]:
    """Feed (a)'s variants side by side: each one's overlap share (train and feed mode, from the
    profiler), step time and data wait (train), batches/s (feed)."""
    out: dict[str, dict[str, Any]] = {}
    for variant in variants:
        name = "a" if variant == DEFAULT_VARIANT else f"a[{variant}]"
        t = (train or {}).get("feeds", {}).get(name) or {}
        f = (feed or {}).get("feeds", {}).get(name) or {}
        out[variant] = {
            "feed": name, "wait_on_consumer": VARIANTS[variant][0], "keep_references": VARIANTS[variant][1],
            "train_overlap_share": (t.get("overlap") or {}).get("overlap_share"),
            "wall_step_ms": t.get("wall_step_ms"), "data_wait_fraction": t.get("data_wait_fraction"),
            "feed_overlap_share": (f.get("profile") or {}).get("overlap_share"),
            "batches_per_s": f.get("batches_per_s"),
        }
    return out


def _parser() -> argparse.ArgumentParser:
    """The command line: every option, its default told in its help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-dry-run", action="store_true",
                   help="run every code path on CPU with tiny sizes; GPU figures replaced by labelled stand-ins")
    p.add_argument("--mode", default="train,feed", help="train, feed or both (default train,feed)")
    p.add_argument("--feeds", default="a,b,c", help="which feeds, in order (default a,b,c)")
    p.add_argument("--variants", default=DEFAULT_VARIANT,
                   help=f"feed (a)'s guards of device memory, run side by side, each with its overlap: "
                   f"{', '.join(VARIANTS)} or all (default {DEFAULT_VARIANT}, the feed's own)")
    p.add_argument("--batch-size", type=int, default=None, help="default 256 (dry run 8)")
    p.add_argument("--workers", type=int, default=None,
                   help="num_workers of every loader (default: usable cores - 4, at most 12; dry run 2)")
    p.add_argument("--prefetch-factor", type=int, default=4, help="prefetch_factor of every loader (default 4)")
    p.add_argument("--image-size", type=int, default=None, help="JPEG and crop size (default 224, dry run 32)")
    p.add_argument("--images", type=int, default=None, help="distinct demo images (default 1024, dry run 32)")
    p.add_argument("--data-dir", default=None,
                   help="where the demo images are made once (default /tmp/gpufeed-cuda-feed-SIZE)")
    p.add_argument("--cache-bytes", default=None, help="FastLoader feeds (a, c) only: cache_bytes (default none)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per feed and round (default 60, dry run 4)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps (or batches) first (default 10, dry run 1)")
    p.add_argument("--profile-steps", type=int, default=None,
                   help="steps (or batches) under torch.profiler (default 6, dry run 2)")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds over the feeds, order rotated (default 2, dry run 1)")
    p.add_argument("--feed-batches", type=int, default=None,
                   help="feed mode: batches per feed (default 120, dry run 8)")
    p.add_argument("--bandwidth-reps", type=int, default=20, help="pinned reference copies (default 20)")
    p.add_argument("--model", choices=("resnet50", "small"), default=None, help="default resnet50 (dry run small)")
    p.add_argument("--json", metavar="OUT", help="also write every figure as JSON to OUT")
    p.add_argument("--require-goals", action="store_true",
                   help="exit 1 unless every goal was judged and met (a goal not judged fails too)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="time budget (seconds from start): a train round after the first, or the feed mode, "
                   "starts only if it should end within it (default: none)")
    return p


def _parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, set[str]]:
    """Parse and fill the dry-run or GPU defaults; returns the arguments and the modes."""
    p = _parser()
    args = p.parse_args(argv)
    dry = args.cpu_dry_run
    cores = int(describe_environment()["usable_cores"])  # type: ignore[call-overload]
    defaults = dict(batch_size=(8, 256), workers=(2, max(1, min(12, cores - 4))), image_size=(32, 224),
                    images=(32, 1024), steps=(4, 60), warmup=(1, 10), profile_steps=(2, 6), rounds=(1, 2),
                    feed_batches=(8, 120), model=("small", "resnet50"))
    for key, (dry_value, gpu_value) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, dry_value if dry else gpu_value)
    if args.data_dir is None:
        args.data_dir = os.path.join(tempfile.gettempdir(), f"gpufeed-cuda-feed-{args.image_size}")
    args.feeds = [f.strip() for f in args.feeds.split(",") if f.strip()]
    modes = {m.strip() for m in args.mode.split(",") if m.strip()}
    if unknown := [f for f in args.feeds if f not in FEEDS] + sorted(modes - {"train", "feed"}):
        p.error(f"unknown feed or mode: {unknown}")
    variants = list(VARIANTS) if args.variants.strip() == "all" else [
        v.strip() for v in args.variants.split(",") if v.strip()]
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"unknown --variants {unknown}; expected some of {list(VARIANTS)} or all")
    extra = [f"a[{v}]" for v in variants if v != DEFAULT_VARIANT]
    if extra and "a" not in args.feeds:
        p.error("--variants are variants of feed a: add a to --feeds")
    if extra:
        at = args.feeds.index("a") + 1
        args.feeds[at:at] = extra
    args.variants = variants
    if args.warmup < 1:
        p.error("--warmup must be >= 1")
    return args, modes


def _log(line: str) -> None:
    print(line, flush=True)


def _environment(args: argparse.Namespace, device: torch.device, clock: StepTimer) -> dict[str, Any]:
    """Describe the machine (and GPU) and log the run's header lines."""
    env = describe_environment(num_workers=args.workers)
    cores = env["usable_cores"]
    if clock.on_gpu:
        props = torch.cuda.get_device_properties(device)
        env.update(gpu=props.name, gpu_memory_bytes=props.total_memory, cuda=torch.version.cuda,
                   cudnn=torch.backends.cudnn.version())
        _log(f"cuda_feed: {props.name}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
             f"{cores} usable cores, decode {env['decode_backend']}")
    else:
        _log(f"cuda_feed: CPU DRY RUN ({STAND_IN}s replace CUDA events, GPU profiler records and H2D "
             f"bandwidth; no figure below is a GPU figure and no goal is judged)")
    _log(f"batch {args.batch_size}, num_workers={args.workers}, prefetch_factor={args.prefetch_factor}, "
         f"feeds {','.join(args.feeds)}, timings from {clock.source}")
    return env


def _report(train: dict[str, Any] | None, feed: dict[str, Any] | None, goals: list[tuple[str, bool | None, str]],
            errors: dict[str, Any], mismatch: list[str], on_gpu: bool, started: float,
            variants: dict[str, dict[str, Any]]) -> bool:
    """Log the tables, failures and goals; returns whether every feed ran and agreed."""
    tag = "" if on_gpu else f" [every figure: {STAND_IN}]"
    _log("")
    if train is not None and train["feeds"]:
        _log(f"train ({train['model']}; compute only {train['compute_only_step_ms']:.2f} ms/step){tag}:")
        _log(format_train_table(train))
    if len(variants) > 1:
        _log(f"feed (a)'s variants (H2D overlap with compute, train / feed mode){tag}:")
        for variant, v in variants.items():
            step = "n/a" if v["wall_step_ms"] is None else f"{v['wall_step_ms']:.2f} ms/step"
            _log(f"  {variant:<22} overlap {_pct(v['train_overlap_share'])} / {_pct(v['feed_overlap_share'])}, "
                 f"{step}, data wait {_pct(v['data_wait_fraction'])}")
    if feed is not None and feed["feeds"]:
        cells = ", ".join(f"{n} {r['batches_per_s']:.1f}" for n, r in feed["feeds"].items())
        pinned = feed["pinned"]
        ref = "n/a" if pinned is None else f"{pinned['gbps']:.1f} GB/s ({pinned['source']})"
        _log(f"feed only (batches/s): {cells}; pinned reference {ref}{tag}")
    for what, error in errors.items():
        _log(f"FAILED {what}: {error}")
    if mismatch:
        _log("BATCH MISMATCH between feeds: " + "; ".join(mismatch))
    for goal, met, evidence in goals:
        _log(f"goal {goal}: {'met' if met else 'NOT met' if met is False else 'not judged'} ({evidence})")
    if not on_gpu:
        _log("goals: not judged on a CPU dry run")
    ok = not errors and not mismatch
    _log(f"cuda_feed: {'done' if ok else 'FAILED'} in {time.perf_counter() - started:.1f} s"
         + ("" if not goals else f"; goals met {sum(m is True for _, m, _ in goals)}/{len(goals)}, "
            f"not met {sum(m is False for _, m, _ in goals)}, not judged {sum(m is None for _, m, _ in goals)}"))
    return ok


def main(argv: list[str] | None = None) -> int:
    args, modes = _parse_args(argv)
    dry = args.cpu_dry_run
    started = time.perf_counter()
    args.deadline = started + args.budget_s if args.budget_s is not None else float("inf")
    if dry:
        device = torch.device("cpu")
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        print(f"cuda_feed: no CUDA (torch {torch.__version__}, CUDA {torch.version.cuda}, "
              f"torch.cuda.is_available() is False); use --cpu-dry-run to exercise the script on CPU")
        return 2
    clock = StepTimer(device)
    setup = Setup(device, args.batch_size, args.workers, args.prefetch_factor, args.cache_bytes)
    env = _environment(args, device, clock)
    # What was measured reaches the JSON even when the run is cut short: the budget skips the
    # rest, a SIGTERM (``timeout`` in make gpu-check) or an error ends it; ``cut_short`` says why.
    run: dict[str, Any] = {"train": None, "feed": None, "cut_short": None}
    signal.signal(signal.SIGTERM, _terminated)
    try:
        if "train" in modes:
            _log(f"train mode: {args.rounds} round(s) x {args.warmup} warm-up + {args.steps} timed + "
                 f"{args.profile_steps} profiled steps per feed")
            run["train"] = train_mode(args, setup, clock, _log)
        if "feed" in modes and time.perf_counter() > args.deadline:
            run["cut_short"] = f"feed mode skipped: --budget-s {args.budget_s:g} spent"
            _log(f"budget: {run['cut_short']}")
        elif "feed" in modes:
            _log(f"feed mode: synthetic 3x{args.image_size}x{args.image_size} uint8, {args.feed_batches} "
                 "batches per feed")
            run["feed"] = feed_mode(args, setup, clock, _log)
    except BaseException as exc:
        run["cut_short"] = describe_error(exc) if isinstance(exc, Exception) else f"{type(exc).__name__}: {exc}"
        _log(f"cuda_feed: cut short ({run['cut_short']})")
        if args.json:
            _write_json(args, dry, clock, env, run, ok=False, goals=[], errors={"run": run["cut_short"]})
        raise
    train, feed = run["train"], run["feed"]

    goals = judge(train, feed) if clock.on_gpu else []
    errors = {**{f"train {k}": v for k, v in (train or {}).get("errors", {}).items()},
              **{f"feed {k}": v for k, v in (feed or {}).get("errors", {}).items()}}
    mismatch = (train or {}).get("batch_mismatch", [])
    run["variants"] = variants_summary(train, feed, args.variants)
    ok = _report(train, feed, goals, errors, mismatch, clock.on_gpu, started, run["variants"])
    if args.json:
        _write_json(args, dry, clock, env, run, ok=ok, goals=goals, errors=errors)
    if not ok:
        return 1
    if args.require_goals and not (goals and all(m is True for _, m, _ in goals)):
        _log("cuda_feed: --require-goals: " + ("no goal judged (a CPU dry run)" if not goals else
                                                "a goal was not met or not judged"))
        return 1
    return 0


class Terminated(BaseException):
    """SIGTERM arrived (a time limit): raised in the main thread so the JSON is still written (a
    BaseException, as KeyboardInterrupt: the per-feed handlers must not take it for a feed's
    failure; the modes that completed are kept, the one it interrupted is lost)."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum} (SIGTERM): the time limit of the caller")


def _write_json(args: argparse.Namespace, dry: bool, clock: StepTimer, env: dict[str, Any], run: dict[str, Any],
                *, ok: bool, goals: list[tuple[str, bool | None, str]], errors: dict[str, Any]) -> None:
    payload = {"benchmark": "cuda_feed", "dry_run": dry, "timing_source": clock.source, "ok": ok,
               "cut_short": run["cut_short"], "args": {k: v for k, v in vars(args).items() if k != "deadline"},
               "environment": env, "train": run["train"], "feed": run["feed"],
               "variants": run.get("variants"), "errors": errors,
               "goals": [{"goal": g, "met": m, "evidence": e} for g, m, e in goals]}
    with open(args.json, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, default=str)
    _log(f"wrote {args.json}")

if __name__ == "__main__":
    sys.exit(main())
