"""The serving benchmark's parts (``benchmarks/serve.py`` drives them; ``serve_threads.py``
reuses them): the preprocessing + model :class:`Pipeline`, the services under test (batch-1
handler threads, ``DynamicBatcher``, ``ImageBatcher``), the open-loop Poisson generator and the
closed-loop clients, and each run's :class:`Result`."""

from __future__ import annotations

import argparse
import math
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from benchmarks import serve_device  # --device: its defaults, CUDA check and GPU helpers
from benchmarks._common import tree_cpu_s
from benchmarks.serve_models import ModelSpec
from gpufeed.image import ResizeCenterCrop
from gpufeed.serve import DynamicBatcher, ImageBatcher, Overloaded

NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # 0-1 scale, as ImageBatcher/FastLoader take it
MEAN = torch.tensor(NORMALIZE[0]).view(1, 3, 1, 1) * 255
STD = torch.tensor(NORMALIZE[1]).view(1, 3, 1, 1) * 255


class Pipeline:
    """Preprocessing (one JPEG -> uint8 CHW tensor) and the model (a list of them -> logits).
    On a CUDA ``device`` the batch is pinned, copied without blocking, normalized and run there,
    and the logits come back with ``.cpu()`` (a sync: the answer exists on the host)."""

    def __init__(self, spec: ModelSpec, device: torch.device | None = None) -> None:
        self.transform = ResizeCenterCrop(size=spec.size, resize=spec.resize)
        self.size = spec.size
        self.device = device if device is not None else torch.device("cpu")
        self.cuda = self.device.type == "cuda"
        self.model = spec.build().eval().to(self.device)
        self.mean, self.std = MEAN.to(self.device), STD.to(self.device)

    def preprocess(self, data: bytes) -> torch.Tensor:
        out = np.empty((3, self.size, self.size), np.uint8)
        self.transform.apply(data, out=out)
        return torch.from_numpy(out)

    def run(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            x = torch.stack(inputs)
            if self.cuda:
                x = x.pin_memory().to(self.device, non_blocking=True)
            x = (x.float() - self.mean) / self.std
            out = self.model(x)
            return out.cpu() if self.cuda else out


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
    cpu_ms_per_request: float = math.nan  # closed loop: CPU of this process and its children per answer
    our_cores: float = math.nan  # open loop: CPU of this process and its children / wall time (cores)
    host_cores: float = math.nan  # open loop: CPU busy on the whole host / wall time (cores; Linux)
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


def drain_s(args: argparse.Namespace, slo_s: float) -> float:
    """Seconds to wait, after a point's arrivals, for its unanswered requests (--drain-s)."""
    return args.drain_s if args.drain_s is not None else max(2.0, 4 * slo_s)


def open_loop(send: Callable[..., None], stop: Callable[[], None], jpegs: list[bytes], rate: float,
              duration_s: float, max_requests: int, drain_s: float, seed: int) -> tuple[int, list[float], int, int]:
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


Job = tuple[float, bytes, Callable[[float, "bool | None"], None]]  # (arrival, JPEG, done(arrival, ok))


class Service:
    """One way of serving: ``send(job)`` at arrival (never blocks), ``close()`` at the end."""

    mode = ""

    def send(self, job: Job) -> None:
        raise NotImplementedError

    def mean_batch(self) -> float:
        return 1.0

    def close(self) -> None:
        pass


class Batch1(Service):
    """``--cores`` handler threads, each: decode + crop + model on a batch of one."""

    mode = "batch-1"

    def __init__(self, pipe: Pipeline, args: argparse.Namespace) -> None:
        torch.set_num_threads(1)

        def handle(arrival: float, data: bytes, done: Callable[[float, bool | None], None]) -> None:
            try:
                pipe.run([pipe.preprocess(data)])
            except Exception:
                done(arrival, False)
            else:
                done(arrival, True)

        self.server = Server(handle, args.cores)

    def send(self, job: Job) -> None:
        self.server.inbox.put(job)

    def close(self) -> None:
        self.server.close()


class _FutureService(Service):
    """Submit at arrival; ``done`` when the future settles; ``Overloaded`` counts as refused."""

    batcher: Any

    def send(self, job: Job) -> None:
        arrival, data, done = job
        try:
            future = self.batcher.submit(data)
        except Overloaded:
            done(arrival, None)
            return

        def settle(f: Future) -> None:
            done(arrival, not f.cancelled() and f.exception() is None)

        future.add_done_callback(settle)

    def mean_batch(self) -> float:
        return float(self.batcher.stats()["batch_size_mean"])

    def close(self) -> None:
        self.batcher.close(drain=False)


class Batcher(_FutureService):
    """DynamicBatcher; its ``fn`` decodes + crops the batch in the model thread, then the model."""

    mode = "batcher"

    def __init__(self, pipe: Pipeline, spec: ModelSpec, args: argparse.Namespace) -> None:
        mcb = args.max_concurrent_batches or spec.max_concurrent_batches
        torch.set_num_threads(max(1, args.cores // mcb))
        max_batch = args.max_batch_size or spec.max_batch_size
        self.batcher = DynamicBatcher(
            lambda items: pipe.run([pipe.preprocess(data) for data in items]),
            max_batch_size=max_batch,
            max_delay_ms=spec.max_delay_ms if args.max_delay_ms is None else args.max_delay_ms,
            max_queue=max_queue(args, spec),
            max_latency_ms=max_latency_ms(args, spec),
            max_concurrent_batches=mcb,
            name=f"bench-{spec.name}",
        )


class Images(_FutureService):
    """ImageBatcher: decode + crop + normalize in ``--image-workers`` worker processes, straight
    into the batch's arena slot; the model thread(s) only run the model."""

    mode = "images"

    def __init__(self, pipe: Pipeline, spec: ModelSpec, args: argparse.Namespace, warmup: list[bytes]) -> None:
        mcb = args.max_concurrent_batches or spec.max_concurrent_batches
        torch.set_num_threads(image_torch_threads(args))
        max_batch = args.max_batch_size or spec.max_batch_size
        model = serve_device.HostResult(pipe.model) if pipe.cuda else pipe.model
        self.batcher = ImageBatcher(
            model,
            transform=pipe.transform,
            normalize=NORMALIZE,
            device=pipe.device if pipe.cuda else None,
            num_workers=args.image_workers,
            max_batch_size=max_batch,
            max_delay_ms=spec.max_delay_ms if args.max_delay_ms is None else args.max_delay_ms,
            max_queue=max_queue(args, spec),
            max_latency_ms=max_latency_ms(args, spec),
            max_concurrent_batches=mcb,
            mp_context=args.mp_context,
            name=f"bench-images-{spec.name}",
        )
        group = max_queue(args, spec)  # workers started and warm before the clock, never over the queue bound
        for k in range(0, len(warmup), group):
            for f in [self.batcher.submit(d) for d in warmup[k:k + group]]:
                f.result(timeout=120)
        self.base = self.batcher.stats()["batch_size_hist"]

    def mean_batch(self) -> float:
        h = self.batcher.stats()["batch_size_hist"]
        count = h["count"] - self.base["count"]
        return (h["sum"] - self.base["sum"]) / count if count else 0.0


def slo_of(args: argparse.Namespace, spec: ModelSpec) -> float:
    return float(getattr(args, f"slo_ms_{spec.name}", None) or spec.slo_ms)


def max_latency_ms(args: argparse.Namespace, spec: ModelSpec) -> float | None:
    """The batchers' latency budget of admission: ``--max-latency-ms`` (0: none), else
    ``--latency-budget`` (default: the model's ``latency_budget``) x the SLO: the rest of the SLO
    covers what the batcher does not see (the client thread's own delays, run-time spread)."""
    if args.max_latency_ms is not None:
        return float(args.max_latency_ms) or None
    return (args.latency_budget or spec.latency_budget) * slo_of(args, spec)


def max_queue(args: argparse.Namespace, spec: ModelSpec) -> int:
    """``--max-queue``, else, with a latency budget (the default), enough requests for the SLO
    at batch-1's measured capacity (``args.capacity``, set per model): a backstop, the budget
    refuses first; without one, for half the SLO (a full queue then drains in about SLO / 2 at
    that rate). At least one batch per model thread. A count alone cannot serve both ends:
    smaller refuses Poisson bursts at rates the model keeps up with (16 refused 0.2-3% at 1.2x
    batch-1's rate for the small CNN), larger lets the p99 of accepted requests grow past the
    SLO under overload."""
    if args.max_queue:
        return int(args.max_queue)
    max_batch = args.max_batch_size or spec.max_batch_size
    mcb = args.max_concurrent_batches or spec.max_concurrent_batches
    drain_s = slo_of(args, spec) / 1000.0 / (1 if max_latency_ms(args, spec) else 2)
    return max(max_batch * mcb, int(getattr(args, "capacity", 0.0) * drain_s))


def host_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole host since boot, from /proc/stat; NaN elsewhere."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return math.nan, math.nan
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - ticks[3] - ticks[4]) / hz, sum(ticks) / hz


def image_torch_threads(args: argparse.Namespace) -> int:
    return args.image_torch_threads or max(1, args.cores - args.image_workers)


def make_service(mode: str, pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace,
                 ) -> Service:
    if mode == "batch-1":
        return Batch1(pipe, args)
    if mode == "batcher":
        return Batcher(pipe, spec, args)
    return Images(pipe, spec, args, jpegs[:8])


def run_open(mode: str, pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], rate: float, args: argparse.Namespace,
             slo_s: float, seed: int) -> Result:
    service = make_service(mode, pipe, spec, jpegs, args)
    end: list[float] = []

    def stop() -> None:  # CPU read before close: closing ends the ImageBatcher's worker processes
        end.extend([tree_cpu_s(), host_busy_s()[0], time.perf_counter()])
        service.close()

    try:
        cpu0, host0, t0 = tree_cpu_s(), host_busy_s()[0], time.perf_counter()
        offered, lat, refused, failed = open_loop(service.send, stop, jpegs, rate, args.duration,
                                                  args.max_requests, drain_s(args, slo_s), seed)
        mean_batch = service.mean_batch()
    finally:
        service.close()
    # arrivals capped by --max-requests span about offered / rate seconds, not --duration
    span_s = args.duration if offered < args.max_requests else min(args.duration, offered / rate)
    r = summarize(mode, rate, offered, lat, refused, failed, mean_batch, slo_s, span_s)
    r.our_cores = (end[0] - cpu0) / (end[2] - t0)
    r.host_cores = (end[1] - host0) / (end[2] - t0)  # busy seconds of all CPUs per second
    return r


def closed_loop(mode: str, pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace,
                clients: int | None = None, duration_s: float | None = None) -> Result:
    """``clients`` (default ``--clients``) threads, each sending one JPEG and waiting for its
    answer, again and again, for ``duration_s`` (default ``--duration``) seconds: achieved QPS and
    exact per-request latencies."""
    clients = args.clients if clients is None else clients
    duration_s = args.duration if duration_s is None else duration_s
    service = make_service(mode, pipe, spec, jpegs, args)
    lock = threading.Lock()
    latencies: list[float] = []
    counts = {"refused": 0, "failed": 0, "sent": 0}
    stop_at = time.perf_counter() + duration_s

    def client(k: int) -> None:
        i = k
        while time.perf_counter() < stop_at:
            answered = threading.Event()
            outcome: list[bool | None] = []

            def done(arrival: float, ok: bool | None, outcome: list[bool | None] = outcome,
                     answered: threading.Event = answered) -> None:
                outcome.append(ok)
                answered.set()

            t0 = time.perf_counter()
            service.send((t0, jpegs[i % len(jpegs)], done))
            i += clients
            if not answered.wait(60.0):
                outcome.append(False)
            t1 = time.perf_counter()
            with lock:
                counts["sent"] += 1
                if outcome[0] is True:
                    latencies.append(t1 - t0)
                elif outcome[0] is None:
                    counts["refused"] += 1
                    time.sleep(0.001)  # a refused client backs off a little before retrying
                else:
                    counts["failed"] += 1

    threads = [threading.Thread(target=client, args=(k,), name=f"bench-client-{k}") for k in range(clients)]
    cpu0 = tree_cpu_s()
    start = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120.0)
        elapsed = time.perf_counter() - start
        cpu_s = tree_cpu_s() - cpu0
        mean_batch = service.mean_batch()
    finally:
        service.close()
    r = summarize(mode, 0.0, counts["sent"], latencies, counts["refused"], counts["failed"], mean_batch,
                  math.inf, elapsed)
    r.cpu_ms_per_request = 1000 * cpu_s / max(1, r.answered)
    return r


def result_ratios(r: Result, base: Result | None) -> tuple[float, float, float]:
    """(QPS, p99, CPU per request) of ``r`` over ``base``'s; NaN without a base."""
    if base is None or not base.achieved_qps:
        return (math.nan, math.nan, math.nan)
    return (r.achieved_qps / base.achieved_qps, r.p99_ms / base.p99_ms,
            r.cpu_ms_per_request / base.cpu_ms_per_request)


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
