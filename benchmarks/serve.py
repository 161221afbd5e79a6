"""Serving: batch-1 handlers vs DynamicBatcher under open-loop Poisson load (issue 12).

For each model (ResNet-18 at 224x224, a small CNN at 96x96) and each offered rate, an open-loop
generator (Poisson arrivals, bounded by ``--duration`` seconds and ``--max-requests``) sends JPEG
requests from a synthetic image folder to

* **batch-1**: ``--cores`` handler threads; each takes a request from an unbounded queue,
  decodes + resizes/crops it (``ResizeCenterCrop.apply``) and calls the model on a batch of 1.
  torch gets 1 intra-op thread, so the model uses ``--cores`` threads in all.
* **batcher**: the generator submits the JPEG bytes at once (``DynamicBatcher.submit``); the
  batcher's ``fn`` decodes + resizes/crops each request of the batch and calls the model once,
  in ``max_concurrent_batches`` model threads (default 2) with ``cores //
  max_concurrent_batches`` torch threads each, so again ``--cores`` threads in all.
  A full queue (``--max-queue``) refuses the request at once (``Overloaded``).

Latency is exact per request: scheduled arrival to result. Requests not answered within the
drain window after the last arrival (``max(2 s, 4 x SLO)``) count as unanswered. A rate is
*sustained* when >= 97% of offered requests are answered, < 1% refused and p99 < SLO.
Offered rates are multiples (``--rates``) of batch-1's capacity estimated at start-up
(``cores / seconds per batch-1 call``, preprocessing included).

    python benchmarks/serve.py [--models resnet18 smallcnn] [--rates 0.5 0.8 1 1.2 1.5 2]
                               [--duration 4] [--cores 2] [--slo-ms-resnet18 250]
                               [--slo-ms-smallcnn 50] [--json OUT]

Goals (2 cores): sustained rate at the SLO >= 1.2x batch-1's for the small CNN and >= 1.0x for
ResNet-18; at 1.5x batch-1's capacity the batcher's p99 of answered requests stays under the SLO.
ResNet-18 is torchvision's when it imports, else the standard BasicBlock network defined here
(random weights either way).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gpufeed.serve import DynamicBatcher, Overloaded
from gpufeed.synth import make_image_folder
from gpufeed.transforms import ResizeCenterCrop

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


# -- models ---------------------------------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + (x if self.down is None else self.down(x)))


def resnet18(num_classes: int = 1000) -> nn.Module:
    """torchvision's ResNet-18 when it imports, else the same architecture (random weights)."""
    try:
        from torchvision.models import resnet18 as tv_resnet18

        return tv_resnet18(weights=None, num_classes=num_classes)
    except Exception:
        pass
    layers: list[nn.Module] = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
        cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def small_cnn(num_classes: int = 10) -> nn.Module:
    """A small CNN for 96x96 inputs (~13 MFLOPs): per-call overhead is a large share."""

    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, 2, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    return nn.Sequential(
        *block(3, 16), *block(16, 32), *block(32, 64), *block(64, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes),
    )


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], nn.Module]
    size: int  # crop (pixels)
    resize: int  # shorter side before the crop
    slo_ms: float
    max_batch_size: int
    max_delay_ms: float
    max_concurrent_batches: int


SPECS = {
    "resnet18": ModelSpec("resnet18", resnet18, 224, 256, 250.0, 4, 10.0, 2),
    "smallcnn": ModelSpec("smallcnn", small_cnn, 96, 110, 50.0, 8, 2.0, 2),
}


class Pipeline:
    """Preprocessing (one JPEG -> uint8 CHW tensor) and the model (a list of them -> logits)."""

    def __init__(self, spec: ModelSpec) -> None:
        self.transform = ResizeCenterCrop(size=spec.size, resize=spec.resize)
        self.size = spec.size
        self.model = spec.build().eval()

    def preprocess(self, data: bytes) -> torch.Tensor:
        out = np.empty((3, self.size, self.size), np.uint8)
        self.transform.apply(data, out=out)
        return torch.from_numpy(out)

    def run(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            x = (torch.stack(inputs).float() - MEAN) / STD
            return self.model(x)


# -- load generation ------------------------------------------------------------------------------


@dataclass
class Result:
    mode: str
    offered_qps: float
    offered: int = 0
    answered: int = 0
    refused: int = 0
    failed: int = 0
    achieved_qps: float = 0.0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    mean_batch: float = 1.0
    sustained: bool = False
    latencies_s: list[float] = field(default_factory=list, repr=False)


class Server:
    """Handler threads fed by an unbounded queue; ``handle(arrival, data, done)`` per request."""

    def __init__(self, handle: Callable[[float, bytes, Callable[[float, bool], None]], None], threads: int) -> None:
        self.handle = handle
        self.inbox: queue.SimpleQueue[tuple[float, bytes, Callable[[float, bool], None]] | None] = queue.SimpleQueue()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._loop, name=f"bench-handler-{i}", daemon=True)
                        for i in range(threads)]
        for t in self.threads:
            t.start()

    def _loop(self) -> None:
        while True:
            job = self.inbox.get()
            if job is None:
                return
            if self.stop.is_set():
                continue  # abandoned at the end of the drain window: drop, do not serve
            self.handle(*job)

    def close(self) -> None:
        self.stop.set()
        for _ in self.threads:
            self.inbox.put(None)
        for t in self.threads:
            t.join(60.0)


def open_loop(send: Callable[..., None], stop: Callable[[], None], jpegs: list[bytes], rate: float, duration_s: float, max_requests: int,
              drain_s: float, seed: int) -> tuple[int, list[float], int, int]:
    """Poisson arrivals at ``rate`` for ``duration_s`` (at most ``max_requests``); returns
    (offered, latencies of answered requests, refused, failed)."""
    rng = np.random.default_rng(seed)
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"refused": 0, "failed": 0}
    all_done = threading.Event()
    pending = [0]

    def done(arrival: float, ok: bool | None) -> None:
        now = time.perf_counter()
        with lock:
            if ok is True:
                latencies.append(now - arrival)
            elif ok is None:
                counts["refused"] += 1
            else:
                counts["failed"] += 1
            pending[0] -= 1
            if pending[0] == 0 and generating_over.is_set():
                all_done.set()

    generating_over = threading.Event()
    start = time.perf_counter()
    t = start
    offered = 0
    while offered < max_requests:
        t += rng.exponential(1.0 / rate)
        if t - start > duration_s:
            break
        delay = t - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        with lock:
            pending[0] += 1
        send((t, jpegs[offered % len(jpegs)], done))
        offered += 1
    with lock:
        generating_over.set()
        if pending[0] == 0:
            all_done.set()
    all_done.wait(drain_s)
    stop()
    with lock:
        return offered, list(latencies), counts["refused"], counts["failed"]


def run_batch1(pipe: Pipeline, jpegs: list[bytes], rate: float, args: argparse.Namespace, slo_s: float,
               seed: int) -> Result:
    torch.set_num_threads(1)

    def handle(arrival: float, data: bytes, done: Callable[[float, bool | None], None]) -> None:
        try:
            pipe.run([pipe.preprocess(data)])
        except Exception:
            done(arrival, False)
        else:
            done(arrival, True)

    server = Server(handle, args.cores)
    offered, lat, refused, failed = open_loop(server.inbox.put, server.close, jpegs, rate, args.duration, args.max_requests,
                                              max(2.0, 4 * slo_s), seed)
    return summarize("batch-1", rate, offered, lat, refused, failed, 1.0, slo_s, args.duration)


def run_batcher(pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], rate: float, args: argparse.Namespace,
                slo_s: float, seed: int) -> Result:
    mcb = args.max_concurrent_batches or spec.max_concurrent_batches
    torch.set_num_threads(max(1, args.cores // mcb))
    max_batch = args.max_batch_size or spec.max_batch_size
    batcher = DynamicBatcher(
        lambda items: pipe.run([pipe.preprocess(data) for data in items]),
        max_batch_size=max_batch,
        max_delay_ms=spec.max_delay_ms if args.max_delay_ms is None else args.max_delay_ms,
        max_queue=args.max_queue or max_batch * mcb,
        max_concurrent_batches=mcb,
        name=f"bench-{spec.name}",
    )

    def send(job: tuple[float, bytes, Callable[[float, bool | None], None]]) -> None:
        arrival, data, done = job
        try:
            future = batcher.submit(data)
        except Overloaded:
            done(arrival, None)
            return

        def settle(f: Future) -> None:
            done(arrival, not f.cancelled() and f.exception() is None)

        future.add_done_callback(settle)

    try:
        offered, lat, refused, failed = open_loop(send, lambda: None, jpegs, rate, args.duration, args.max_requests,
                                                  max(2.0, 4 * slo_s), seed)
    finally:
        batcher.close(drain=False)
    return summarize("batcher", rate, offered, lat, refused, failed, batcher.stats()["batch_size_mean"],
                     slo_s, args.duration)


def summarize(mode: str, rate: float, offered: int, lat: list[float], refused: int, failed: int,
              mean_batch: float, slo_s: float, duration_s: float) -> Result:
    r = Result(mode, rate, offered, len(lat), refused, failed, len(lat) / duration_s, mean_batch=mean_batch)
    if lat:
        arr = np.asarray(lat) * 1000
        r.p50_ms, r.p99_ms = float(np.percentile(arr, 50)), float(np.percentile(arr, 99))
    r.sustained = (offered > 0 and r.answered >= 0.97 * offered and refused < 0.01 * offered
                   and r.p99_ms < slo_s * 1000)
    r.latencies_s = lat
    return r


# -- driver ---------------------------------------------------------------------------------------


def calibrate(pipe: Pipeline, jpegs: list[bytes], cores: int) -> float:
    """Batch-1 capacity estimate (requests/s): ``cores`` / median seconds of one request."""
    torch.set_num_threads(1)
    for data in jpegs[:3]:
        pipe.run([pipe.preprocess(data)])
    times = []
    for data in jpegs[:15]:
        t0 = time.perf_counter()
        pipe.run([pipe.preprocess(data)])
        times.append(time.perf_counter() - t0)
    return cores / float(np.median(times))


def bench_model(spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    slo_ms = getattr(args, f"slo_ms_{spec.name}") or spec.slo_ms
    slo_s = slo_ms / 1000.0
    pipe = Pipeline(spec)
    capacity = calibrate(pipe, jpegs, args.cores)
    mcb = args.max_concurrent_batches or spec.max_concurrent_batches
    print(f"\n== {spec.name} ({spec.size}x{spec.size}), SLO p99 < {slo_ms:g} ms; batch-1 capacity estimate "
          f"{capacity:.1f} req/s; batch-1: {args.cores} handlers x 1 torch thread; batcher: submit "
          f"in the generator, preprocess + model in fn, {mcb} model thread(s) x {max(1, args.cores // mcb)} torch threads, "
          f"max_batch_size={args.max_batch_size or spec.max_batch_size}")
    print(f"{'offered/s':>9} {'mode':<8} {'offered':>7} {'answered':>8} {'refused':>7} {'QPS':>7} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'batch':>6}  ok")
    rows: list[Result] = []
    for i, mult in enumerate(args.rates):
        rate = mult * capacity
        for mode in ("batch-1", "batcher"):  # alternate, same rate and arrival seed
            if mode == "batch-1":
                r = run_batch1(pipe, jpegs, rate, args, slo_s, seed=i)
            else:
                r = run_batcher(pipe, spec, jpegs, rate, args, slo_s, seed=i)
            rows.append(r)
            print(f"{rate:9.1f} {r.mode:<8} {r.offered:7d} {r.answered:8d} {r.refused:7d} {r.achieved_qps:7.1f} "
                  f"{r.p50_ms:8.1f} {r.p99_ms:8.1f} {r.mean_batch:6.2f}  {'yes' if r.sustained else 'no'}")
            sys.stdout.flush()

    def best(mode: str) -> float:
        return max((r.offered_qps for r in rows if r.mode == mode and r.sustained), default=0.0)

    b1, bb = best("batch-1"), best("batcher")
    ratio = bb / b1 if b1 else math.inf if bb else math.nan
    goal = 1.2 if spec.name == "smallcnn" else 1.0
    print(f"{spec.name}: highest sustained offered rate: batcher {bb:.1f}/s, batch-1 {b1:.1f}/s -> "
          f"{ratio:.2f}x (goal >= {goal}x: {'met' if ratio >= goal else 'NOT met'})")
    if b1:  # overload: 1.5x the highest rate batch-1 sustained, both sides
        rate = 1.5 * b1
        by = {"batch-1": run_batch1(pipe, jpegs, rate, args, slo_s, seed=99),
              "batcher": run_batcher(pipe, spec, jpegs, rate, args, slo_s, seed=99)}
        rows += by.values()
        ok = by["batcher"].p99_ms < slo_ms
        print(f"{spec.name}: at 1.5x batch-1's sustained rate ({rate:.1f}/s): p99 batcher "
              f"{by['batcher'].p99_ms:.0f} ms (refused {by['batcher'].refused}/{by['batcher'].offered}, "
              f"QPS {by['batcher'].achieved_qps:.0f}), batch-1 {by['batch-1'].p99_ms:.0f} ms (answered "
              f"{by['batch-1'].answered}/{by['batch-1'].offered}, QPS {by['batch-1'].achieved_qps:.0f}) "
              f"(goal batcher p99 < {slo_ms:g} ms: {'met' if ok else 'NOT met'})")
    return {
        "model": spec.name, "slo_ms": slo_ms, "capacity_estimate": capacity,
        "rows": [{k: v for k, v in asdict(r).items() if k != "latencies_s"} for r in rows],
        "sustained": {"batch-1": b1, "batcher": bb, "ratio": ratio},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["smallcnn", "resnet18"], choices=sorted(SPECS))
    p.add_argument("--rates", nargs="+", type=float, default=[0.3, 0.45, 0.6, 0.75, 0.9, 1.1],
                   help="offered rates as multiples of batch-1's capacity estimated in isolation (optimistic)")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of arrivals per point")
    p.add_argument("--max-requests", type=int, default=5000, help="cap on arrivals per point")
    p.add_argument("--cores", type=int, default=min(2, os.cpu_count() or 1),
                   help="handler threads and torch threads in all, per side")
    p.add_argument("--slo-ms-resnet18", type=float, default=None, help="default 250")
    p.add_argument("--slo-ms-smallcnn", type=float, default=None, help="default 50")
    p.add_argument("--max-batch-size", type=int, default=None, help="default per model (smallcnn 8, resnet18 4)")
    p.add_argument("--max-delay-ms", type=float, default=None, help="default per model (smallcnn 2, resnet18 10)")
    p.add_argument("--max-concurrent-batches", type=int, default=None, help="default per model: 2 (one torch thread each, as batch-1)")
    p.add_argument("--max-queue", type=int, default=None, help="default max_batch_size * max_concurrent_batches")
    p.add_argument("--images", type=int, default=64, help="distinct demo JPEGs (350x400)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpufeed-serve-bench-") as tmp:
        make_image_folder(tmp, num_classes=4, per_class=max(1, args.images // 4))
        jpegs = [f.read_bytes() for f in sorted(Path(tmp).rglob("*.jpg")) + sorted(Path(tmp).rglob("*.jpeg"))]
    if not jpegs:
        print("no demo images were written", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs visible, --cores {args.cores}, {len(jpegs)} JPEGs, "
          f"{args.duration:g} s per point; preprocessing (decode + ResizeCenterCrop): batch-1 in its handler, batcher in fn")
    out = [bench_model(SPECS[name], jpegs, args) for name in args.models]
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
