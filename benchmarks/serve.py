"""Serving: batch-1 handlers vs DynamicBatcher vs ImageBatcher, open-loop and closed-loop.

For each model (ResNet-18 at 224x224, a small CNN at 96x96), JPEG requests from a synthetic
image folder go to

* **batch-1**: ``--cores`` handler threads; each takes a request from an unbounded queue,
  decodes + resizes/crops it (``ResizeCenterCrop.apply``) and calls the model on a batch of 1.
  torch gets 1 intra-op thread, so the model uses ``--cores`` threads in all.
* **batcher**: the JPEG bytes are submitted at once (``DynamicBatcher.submit``); the
  batcher's ``fn`` decodes + resizes/crops each request of the batch and calls the model once,
  in ``max_concurrent_batches`` model threads (default 2) with ``cores //
  max_concurrent_batches`` torch threads each, so again ``--cores`` threads in all.
* **images**: ``ImageBatcher``: the bytes are submitted at once; ``--image-workers`` gpufeed
  worker processes decode + crop + normalize each batch into a shared-memory slot; the model
  threads (as for batcher, ``--image-torch-threads`` torch threads) only run the model.

The batchers refuse a request at once (``Overloaded``) when its predicted latency is over
``max_latency_ms`` (latency-aware admission; default ``--latency-budget`` x the SLO, per model)
or their queue is full (``--max-queue``; default: batch-1's measured capacity x SLO, a backstop).

Open loop (``--rates``): Poisson arrivals, bounded by ``--duration`` seconds and
``--max-requests``, at offered rates that are multiples of batch-1's capacity measured at
start-up (batch-1 saturated by ``2 x cores`` closed-loop clients for ``--calibrate-s``).
Latency is exact per request: scheduled arrival to result. Requests not answered within the drain window after the
last arrival (``max(2 s, 4 x SLO)``) count as unanswered. A rate is *sustained* when >= 97% of
offered requests are answered, < 1% refused and p99 < SLO.

Closed loop (``--clients N``): N client threads each send a JPEG, wait for its answer and send
the next, for ``--duration`` seconds per mode: QPS, p50/p99 and CPU milliseconds per answered
request (this process and its children), as ratios against batch-1 measured in the same run.

On a GPU (``--device cuda``; run by ``make gpu-check``) the models run there, results come back to
the host with ``.cpu()``, and the defaults change (ResNet-18 only, max_batch_size 64, usable cores - 4
model threads and decode workers, rates up to 16x batch-1's, a time budget): see serve_device.py.
Goal there: batched >= 5x batch-1's sustained rate for ResNet-18.

    python -m benchmarks.serve [--device cpu|cuda] [--budget-s S] [--stop-after-fails N]
                               [--models resnet18 smallcnn] [--rates 0.5 0.7 0.85 1 1.2 1.4]
                               [--duration 4] [--cores 2] [--slo-ms-resnet18 250]
                               [--slo-ms-smallcnn 50] [--modes batch-1 batcher images]
                               [--image-workers 1] [--clients 16] [--batch1-capacity RPS] [--json OUT]

Goals (2 cores): sustained rate at the SLO >= 1.2x batch-1's for the small CNN and >= 1.0x for
ResNet-18; at 1.5x batch-1's capacity the batchers' p99 of answered requests stays under the SLO
(the overload point: 1.5x batch-1's measured capacity, or its highest sustained rate if higher).
ResNet-18 is torchvision's when it imports, else the standard BasicBlock network defined here
(random weights either way).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks import serve_device  # --device: its defaults, CUDA check and GPU helpers
from benchmarks._serve_load import (  # the services, load generators and results
    Pipeline,
    Result,
    closed_loop,
    drain_s,
    image_torch_threads,
    max_latency_ms,
    max_queue,
    result_ratios,
    run_open,
    slo_of,
)
from benchmarks.serve_models import SPECS, ModelSpec  # models and their settings; serve_threads uses serve.SPECS
from gpufeed.synth import make_image_folder

# -- driver ---------------------------------------------------------------------------------------


def calibrate(pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace) -> float:
    """Batch-1 capacity (requests/s) on this machine now: batch-1 serving saturated by
    ``2 x cores`` closed-loop clients for ``--calibrate-s`` seconds (on a shared machine the
    latency of one call in isolation overestimates it several times)."""
    torch.set_num_threads(1)
    for data in jpegs[:3]:
        pipe.run([pipe.preprocess(data)])
    return closed_loop("batch-1", pipe, spec, jpegs, args, clients=2 * args.cores,
                       duration_s=args.calibrate_s).achieved_qps


def _print_header(spec: ModelSpec, args: argparse.Namespace, slo_ms: float, capacity: float) -> None:
    """The model's heading line and the sweep table's column names."""
    mcb = args.max_concurrent_batches or spec.max_concurrent_batches
    how = "given" if args.batch1_capacity else "measured"
    print(f"\n== {spec.name} ({spec.size}x{spec.size}), SLO p99 < {slo_ms:g} ms; batch-1 capacity ({how}) "
          f"{capacity:.1f} req/s; batch-1: {args.cores} handlers x 1 torch thread; batcher: submit "
          f"in the generator, preprocess + model in fn, {mcb} model thread(s) x {max(1, args.cores // mcb)} "
          f"torch threads, "
          f"max_batch_size={args.max_batch_size or spec.max_batch_size}, max_queue={max_queue(args, spec)}, "
          f"max_latency_ms={max_latency_ms(args, spec)}; "
          "images: ImageBatcher, "
          f"{args.image_workers} decode worker(s) ({args.mp_context}), {mcb} model thread(s) x "
          f"{image_torch_threads(args)} torch threads")
    print(f"{'offered/s':>9} {'mode':<8} {'offered':>7} {'answered':>8} {'refused':>7} {'QPS':>7} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'batch':>6}  ok  {'ours':>4} {'host':>4}  (CPU cores busy: this process tree, "
          f"the whole host of {os.cpu_count()})")


@dataclass
class _Sweep:
    """The open-loop sweep's points and what left points out."""

    rows: list[Result] = field(default_factory=list)
    stopped: dict[str, float] = field(default_factory=dict)  # mode -> the first rate not offered (--stop-after-fails)
    skipped: list[str] = field(default_factory=list)  # points left out for --budget-s
    errors: dict[str, str] = field(default_factory=dict)  # mode -> the error that ended it (the other modes go on)


def _sweep(pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace, capacity: float,
           slo_s: float, deadline: float, point_s: float) -> _Sweep:
    """Offer every rate of ``--rates`` to each mode in turn (same rate and arrival seed) and print each point."""
    sweep = _Sweep()
    misses = dict.fromkeys(args.modes, 0)  # unsustained rates in a row, per mode
    for i, mult in enumerate(args.rates):
        rate = mult * capacity
        for mode in args.modes:  # alternate, same rate and arrival seed
            if mode in sweep.errors:
                continue
            if args.stop_after_fails and misses[mode] >= args.stop_after_fails:
                sweep.stopped.setdefault(mode, rate)
                continue
            if time.perf_counter() + point_s > deadline:
                sweep.skipped.append(f"{mode} at {rate:.1f}/s")
                continue
            try:
                r = run_open(mode, pipe, spec, jpegs, rate, args, slo_s, seed=i)
            except Exception as exc:  # noqa: BLE001 - reported, and the run's exit status says so
                sweep.errors[mode] = f"{type(exc).__name__}: {exc}"
                print(f"{rate:9.1f} {mode:<8} FAILED, no more points for {mode}: {sweep.errors[mode]}")
                continue
            misses[mode] = 0 if r.sustained else misses[mode] + 1
            sweep.rows.append(r)
            print(f"{rate:9.1f} {r.mode:<8} {r.offered:7d} {r.answered:8d} {r.refused:7d} {r.achieved_qps:7.1f} "
                  f"{r.p50_ms:8.1f} {r.p99_ms:8.1f} {r.mean_batch:6.2f}  {'yes' if r.sustained else 'no ':<3} "
                  f"{r.our_cores:4.2f} {r.host_cores:4.2f}")
            sys.stdout.flush()
    for mode, rate in sweep.stopped.items():
        print(f"{spec.name}: {mode} stopped after {args.stop_after_fails} unsustained rates in a row "
              f"(not offered {rate:.1f}/s and above; --stop-after-fails)")
    if sweep.skipped:
        print(f"{spec.name}: budget: {len(sweep.skipped)} point(s) skipped to end within --budget-s "
              f"{args.budget_s:g}: " + ", ".join(sweep.skipped))
    return sweep


def _headline(spec: ModelSpec, args: argparse.Namespace, sweep: _Sweep,
              capacity: float) -> tuple[dict[str, float], dict[str, Any], dict[str, float]]:
    """Each mode's highest sustained rate over batch-1's, the best such ratio (the headline) and each
    mode's most answers/s at any rate; printed. Returns (sustained, headline, peak)."""
    rows, modes = sweep.rows, args.modes

    def best(mode: str) -> float:
        return max((r.offered_qps for r in rows if r.mode == mode and r.sustained), default=0.0)

    b1 = best("batch-1")
    goal = serve_device.GOALS.get((args.torch_device.type, spec.name))
    sustained: dict[str, float] = {"batch-1": b1}
    headline: dict[str, Any] = {"mode": None, "ratio": math.nan, "goal": goal, "met": None, "lower_bound": False}
    for mode in modes:
        if mode == "batch-1" or not args.rates:
            continue
        bb = sustained[mode] = best(mode)
        ratio = bb / b1 if b1 else math.nan
        sustained[f"{mode}/batch-1"] = ratio
        # sustained at the highest rate it was offered: its limit is higher, the ratio a lower bound
        top = bb > 0 and bb >= max((r.offered_qps for r in rows if r.mode == mode), default=0.0)
        verdict = ("no ratio: batch-1 sustained no rate of the sweep; add lower --rates" if not b1 else
                   f"no goal for {spec.name} on {args.torch_device.type}" if goal is None else
                   f"goal >= {goal}x: {'met' if ratio >= goal else 'NOT met'}")
        print(f"{spec.name}: highest sustained offered rate: {mode} {bb:.1f}/s, batch-1 {b1:.1f}/s -> "
              f"{ratio:.2f}x ({verdict})" + (" (the top rate offered: a lower bound; add higher --rates)"
                                               if top else ""))
        if b1 and not ratio <= headline["ratio"]:  # the first real ratio, or a higher one
            headline.update(mode=mode, ratio=ratio, lower_bound=top,
                            met=None if goal is None else bool(ratio >= goal))
    for mode, error in sweep.errors.items():
        print(f"{spec.name}: {mode} FAILED: {error}")
    # A second figure that needs no sustained batch-1 rate: the most answers per second any point got
    peak = {mode: max((r.achieved_qps for r in rows if r.mode == mode), default=0.0) for mode in modes}
    if any(peak.values()):
        print(f"{spec.name}: most answers/s at any rate: " + ", ".join(
            f"{mode} {q:.0f}/s ({q / capacity:.2f}x batch-1's measured capacity)" for mode, q in peak.items()))
    if headline["mode"] is not None:
        print(f"{spec.name} headline ({args.torch_device.type}): {headline['mode']} sustains {headline['ratio']:.2f}x "
              f"batch-1's QPS at the SLO" + ("" if goal is None else
                                              f" (goal >= {goal}x: {'met' if headline['met'] else 'NOT met'})")
              + (", a lower bound" if headline["lower_bound"] else ""))
    return sustained, headline, peak


def _overload(pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace, rate: float,
              slo_ms: float) -> list[Result]:
    """Every mode at ``rate`` (1.5x batch-1's capacity): p99 against the SLO, printed."""
    by = {mode: run_open(mode, pipe, spec, jpegs, rate, args, slo_ms / 1000.0, seed=99) for mode in args.modes}
    for mode, r in by.items():
        ok = r.p99_ms < slo_ms
        print(f"{spec.name}: at 1.5x batch-1's capacity ({rate:.1f}/s): {mode:<8} p99 {r.p99_ms:.0f} ms, "
              f"QPS {r.achieved_qps:.0f}, answered {r.answered}/{r.offered}, refused {r.refused}"
              + ("" if mode == "batch-1" else f" (goal p99 < {slo_ms:g} ms: {'met' if ok else 'NOT met'})"))
    return list(by.values())


def _closed_loop_rounds(pipe: Pipeline, spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace,
                        deadline: float) -> list[Result]:
    """``--rounds`` rounds of ``--clients`` closed-loop clients, the modes alternating in each; printed
    with each run's ratios to the same round's batch-1 run and the medians over the rounds."""
    modes = args.modes
    clients: list[Result] = []
    print(f"{spec.name}: {args.clients} closed-loop clients, {args.duration:g} s per mode and round, "
          f"{args.rounds} rounds alternating the modes (each client sends a JPEG, waits for its answer, "
          "sends the next); x: ratio to the batch-1 run of the same round")
    print(f"{'round':>5} {'mode':<8} {'answered':>8} {'refused':>7} {'QPS':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'batch':>6} {'CPU ms/req':>10}  QPS x  p99 x  CPU x")
    for k in range(args.rounds):
        if time.perf_counter() + len(modes) * (args.duration + 2.0) > deadline:
            print(f"budget: closed-loop round {k} and later skipped (--budget-s {args.budget_s:g})")
            break
        base: Result | None = None
        for mode in modes:
            r = closed_loop(mode, pipe, spec, jpegs, args)
            clients.append(r)
            if mode == "batch-1":
                base = r
            x = result_ratios(r, base)
            print(f"{k:5d} {r.mode:<8} {r.answered:8d} {r.refused:7d} {r.achieved_qps:7.1f} {r.p50_ms:8.1f} "
                  f"{r.p99_ms:8.1f} {r.mean_batch:6.2f} {r.cpu_ms_per_request:10.2f}  "
                  f"{x[0]:5.2f}  {x[1]:5.2f}  {x[2]:5.2f}")
            sys.stdout.flush()
    for mode in modes[1:] if modes[0] == "batch-1" else []:
        per_round = [result_ratios(r, b) for r, b in zip([c for c in clients if c.mode == mode],
                                                   [c for c in clients if c.mode == "batch-1"])]
        if not per_round:
            continue
        med = [float(np.median([x[i] for x in per_round])) for i in range(3)]
        print(f"{spec.name}: closed loop, {mode} / batch-1, median of {len(per_round)} rounds: QPS {med[0]:.2f}x, "
              f"p99 {med[1]:.2f}x, CPU per request {med[2]:.2f}x")
    return clients


def _plain(rows: list[Result]) -> list[dict[str, Any]]:
    return [{k: v for k, v in asdict(r).items() if k != "latencies_s"} for r in rows]


def bench_model(spec: ModelSpec, jpegs: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    slo_ms = slo_of(args, spec)
    slo_s = slo_ms / 1000.0
    pipe = Pipeline(spec, args.torch_device)
    if pipe.cuda:  # CUDA context, cuDNN/cuBLAS handles, kernels of the batch sizes at the ends
        serve_device.warm_up(pipe.run, pipe.preprocess(jpegs[0]), [1, args.max_batch_size or spec.max_batch_size])
    capacity = args.capacity = args.batch1_capacity or calibrate(pipe, spec, jpegs, args)
    _print_header(spec, args, slo_ms, capacity)
    deadline = args.started + args.budget_s if args.budget_s else math.inf
    point_s = args.duration + drain_s(args, slo_s) + 2.0  # arrivals, the longest drain, set-up and close
    sweep = _sweep(pipe, spec, jpegs, args, capacity, slo_s, deadline, point_s)
    sustained, headline, peak = _headline(spec, args, sweep, capacity)
    if args.overload and sweep.errors:
        print(f"{spec.name}: the 1.5x overload point skipped: {', '.join(sweep.errors)} failed")
    elif args.overload and time.perf_counter() + len(args.modes) * point_s > deadline:
        print(f"{spec.name}: budget: the 1.5x overload point skipped (--budget-s {args.budget_s:g})")
    elif args.overload:  # overload: 1.5x batch-1's capacity (measured, or its best sustained rate if higher)
        sweep.rows += _overload(pipe, spec, jpegs, args, 1.5 * max(capacity, sustained["batch-1"]), slo_ms)
    clients = _closed_loop_rounds(pipe, spec, jpegs, args, deadline) if args.clients and not sweep.errors else []
    return {
        "model": spec.name, "device": str(args.torch_device), "slo_ms": slo_ms, "capacity_estimate": capacity,
        "headline": headline, "peak_qps": peak, "stopped": sweep.stopped, "skipped": sweep.skipped,
        "errors": sweep.errors, "rows": _plain(sweep.rows), "sustained": sustained, "clients": _plain(clients),
    }


def _parser() -> argparse.ArgumentParser:
    """The command line: every option, its default (CPU and cuda) told in its help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda[:N]: the model (and ImageBatcher's batches) on that GPU; its defaults "
                   "are sized for one H100/H200 host in make gpu-check (see serve_device.py)")
    p.add_argument("--models", nargs="+", default=None, choices=sorted(SPECS),
                   help="default: smallcnn resnet18 (cuda: resnet18)")
    p.add_argument("--rates", nargs="*", type=float, default=None,
                   help="offered rates as multiples of batch-1's capacity measured at start-up (saturated); "
                   "default 0.5 0.7 0.85 1 1.2 1.4 (cuda: 0.25 0.5 1 2 3 4 6 8 12 16)")
    p.add_argument("--drain-s", type=float, default=None,
                   help="after the arrivals, how long unanswered requests are waited for (default max(2 s, 4 x SLO))")
    p.add_argument("--calibrate-s", type=float, default=2.0, help="seconds of the batch-1 capacity measurement")
    p.add_argument("--batch1-capacity", type=float, default=None,
                   help="batch-1's capacity (req/s) to use instead of measuring it: the same offered rates in "
                   "runs compared against each other")
    p.add_argument("--duration", type=float, default=None, help="seconds of arrivals per point (default 3; cuda: 1.5)")
    p.add_argument("--max-requests", type=int, default=None,
                   help="cap on arrivals per point (default 5000; cuda: 40000)")
    p.add_argument("--cores", type=int, default=None,
                   help="handler threads and torch threads in all, per side (default: 2 at most; cuda: the "
                   "usable cores)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="skip the points that would end later than this many seconds after start (default: "
                   "none; cuda: 120)")
    p.add_argument("--stop-after-fails", type=int, default=None,
                   help="stop offering a mode higher rates after this many unsustained rates in a row "
                   "(default 0: never; cuda: 2)")
    p.add_argument("--slo-ms-resnet18", type=float, default=None, help="default 250")
    p.add_argument("--slo-ms-smallcnn", type=float, default=None, help="default 50")
    p.add_argument("--max-batch-size", type=int, default=None,
                   help="default per model (smallcnn 8, resnet18 1; cuda: 64)")
    p.add_argument("--max-delay-ms", type=float, default=None,
                   help="default per model (smallcnn 2, resnet18 2; cuda: 5)")
    p.add_argument("--max-concurrent-batches", type=int, default=None,
                   help="default per model: 2 (one torch thread each, as batch-1; cuda: usable cores - 4)")
    p.add_argument("--max-queue", type=int, default=None,
                   help="default: batch-1's measured capacity x SLO (x SLO / 2 with --max-latency-ms 0), "
                   "at least max_batch_size x max_concurrent_batches")
    p.add_argument("--max-latency-ms", type=float, default=None,
                   help="the batchers' max_latency_ms (latency-aware admission; 0: none); default "
                   "--latency-budget x the SLO")
    p.add_argument("--latency-budget", type=float, default=None,
                   help="max_latency_ms as a fraction of the SLO when --max-latency-ms is not given "
                   "(default per model: smallcnn 0.6, resnet18 0.8)")
    p.add_argument("--images", type=int, default=64, help="distinct demo JPEGs (350x400)")
    p.add_argument("--modes", nargs="+", default=["batch-1", "batcher", "images"],
                   choices=["batch-1", "batcher", "images"], help="batch-1 first: ratios are against it")
    p.add_argument("--image-workers", type=int, default=None,
                   help="ImageBatcher decode processes (default 1; cuda: usable cores - 4)")
    p.add_argument("--image-torch-threads", type=int, default=None,
                   help="torch threads with ImageBatcher (default: cores - image workers, at least 1)")
    p.add_argument("--mp-context", default="forkserver", help="ImageBatcher workers' start method")
    p.add_argument("--clients", type=int, default=None,
                   help="closed-loop clients per mode (0: skip that part; default 16; cuda: 0)")
    p.add_argument("--rounds", type=int, default=3, help="closed-loop rounds (the modes alternate in each)")
    p.add_argument("--no-overload", dest="overload", action="store_false", help="skip the 1.5x overload point")
    p.add_argument("--json", type=Path, default=None,
                   help="write the figures here, after each model and when the run is cut short (SIGTERM)")
    p.add_argument("--require-goals", action="store_true",
                   help="exit 1 unless every model has a goal on this device and its headline met it")
    return p


class Terminated(BaseException):
    """SIGTERM arrived (a time limit): the models measured so far still reach --json."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum} (SIGTERM)")


def _write(args: argparse.Namespace, out: list[dict[str, Any]]) -> None:
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.started = time.perf_counter()
    problem = serve_device.resolve(args)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    if args.modes[0] != "batch-1" and "batch-1" in args.modes:
        args.modes = ["batch-1", *[m for m in args.modes if m != "batch-1"]]
    if "images" in args.modes and args.mp_context == "forkserver":
        # The fork server imports torch and gpufeed's worker once; each worker is then a quick
        # fork of it (a server application does the same at start-up).
        multiprocessing.set_forkserver_preload(["gpufeed._engine.worker", "gpufeed.image._fill"])
    with tempfile.TemporaryDirectory(prefix="gpufeed-serve-bench-") as tmp:
        make_image_folder(tmp, num_classes=4, per_class=max(1, args.images // 4))
        jpegs = [f.read_bytes() for f in sorted(Path(tmp).rglob("*.jpg")) + sorted(Path(tmp).rglob("*.jpeg"))]
    if not jpegs:
        print("no demo images were written", file=sys.stderr)
        return 1
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs visible, --cores {args.cores}, {len(jpegs)} JPEGs, "
          f"{args.duration:g} s per point; preprocessing (decode + ResizeCenterCrop): batch-1 in its handler, "
          f"batcher in fn, images in ImageBatcher's worker processes"
          + ("" if args.torch_device.type == "cpu" else f"; model on {serve_device.describe(args.torch_device)}"))
    out: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, _terminated)
    try:
        for name in args.models:
            out.append(bench_model(SPECS[name], jpegs, args))
            _write(args, out)
    except BaseException as exc:
        reason = f"{type(exc).__name__}: {exc}"
        print(f"serve.py: cut short ({reason}); {len(out)} of {len(args.models)} model(s) measured", flush=True)
        out.append({"model": None, "cut_short": reason, "errors": {"run": reason}})
        _write(args, out)
        raise
    _write(args, out)
    if any(m["errors"] for m in out):
        return 1
    if args.require_goals and not all(m["headline"]["met"] is True for m in out):
        print("serve.py: --require-goals: " + "; ".join(
            f"{m['model']}: " + ("no goal on this device" if m["headline"]["goal"] is None else
                                 f"headline {m['headline']['ratio']:.2f}x, goal >= {m['headline']['goal']}x")
            for m in out if m["headline"]["met"] is not True))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
