"""One host, W ranks: the host cache shared by the ranks against a cache per rank, in one run.

    PYTHONPATH=CHECKOUT python benchmarks/node_cache.py [ROOT] [--ranks 2 4] [--images 2000]
        [--epochs 3] [--workers 1] [--batch-size 64] [--cache-bytes 2GB] [--json OUT]

For each W of ``--ranks``, ``torchrun --nproc_per_node W`` launches (CPU ranks, gloo):
``cache_scope="host"`` (one cache for the host) and ``cache_scope="rank"`` (one per rank, as
before), ``--repeats`` times each, alternating (host, rank, rank, host, ...), and one without a
cache (the memory baseline) after the first pair. Speeds are the medians over the repeats, and
the per-pair ratios are listed (the box is shared: trust ratios within one run). Each rank: a FastLoader over ROOT
with ``ResizeCenterCrop(224, 256)`` uint8 output, a shuffling ``DistributedSampler`` with
``set_epoch``, ``--workers`` persistent workers, ``cache_bytes`` (default ``2GB``, which holds
the set). Reported per launch:

* each rank's cache hit rate per epoch (differences of ``stats()`` between epochs);
* node images/s per epoch: the dataset over the wall time of the epoch between two barriers;
* host memory of the cache: PSS summed over every rank and worker process (psutil) at the end
  of the last epoch, minus the no-cache launch's, in copies of the decoded rows;
  and of that: the arenas' resident bytes (with - without), and for the host cache the PSS of
  its memfd's mappings (smaps), i.e. the cache's own pages;
* CPU seconds per epoch summed over the ranks: their main processes, and their workers;
* the budget: ``stats()["cache_budget_bytes"]`` summed over the ranks that own a budget (one for
  the host cache, W for per-rank caches), over the available memory when the job started.

Without ROOT, ``--images`` photo-like JPEGs of 350-500 px are generated in a temporary folder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("host", "rank", "none")


def _pss_of_job() -> int:
    """PSS (bytes) of every rank and worker: the torchrun agent's descendants."""
    import psutil

    total = 0
    for proc in psutil.Process(os.getppid()).children(recursive=True):
        try:
            total += proc.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def _host_cache_pss() -> int:
    """PSS (bytes) of the host cache's memfd mappings in every rank and worker (smaps)."""
    import psutil

    total = 0
    for proc in psutil.Process(os.getppid()).children(recursive=True):
        try:
            with open(f"/proc/{proc.pid}/smaps") as f:
                inside = False
                for line in f:
                    if not line[0].isupper() or line.startswith("VmFlags"):
                        inside = "memfd:gpufeed-host-cache" in line if "-" in line.split()[0] else inside
                    elif inside and line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def _cpu_s(proc: Any) -> float:
    """User + system CPU seconds of ``proc`` (a psutil.Process)."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def _children_cpu_s(proc: Any) -> float:
    """User + system CPU seconds of ``proc``'s live descendants (the loader's workers)."""
    import psutil

    total = 0.0
    for child in proc.children(recursive=True):
        try:
            total += _cpu_s(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):  # exited meanwhile
            continue
    return total


def rank_main(args: argparse.Namespace) -> None:
    import psutil
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler

    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    available = psutil.virtual_memory().available
    dataset = ImageFolder(args.root, transform=ResizeCenterCrop(224, 256))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    cache = {} if args.mode == "none" else {"cache_bytes": args.cache_bytes, "cache_scope": args.mode}
    loader = FastLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
                        persistent_workers=args.workers > 0, **cache)
    rates, node_rates, before = [], [], (0, 0)
    main_cpu, worker_cpu = [], []
    me = psutil.Process()
    for epoch in range(args.epochs):
        loader.set_epoch(epoch)
        dist.barrier()
        t0 = time.perf_counter()
        c0, w0 = _cpu_s(me), _children_cpu_s(me)
        for images, labels in loader:
            del images, labels
        dist.barrier()
        node_rates.append(len(dataset) / (time.perf_counter() - t0))
        main_cpu.append(_cpu_s(me) - c0)
        worker_cpu.append(_children_cpu_s(me) - w0)
        stats = loader.stats()
        hits, misses = stats["cache_hits"] - before[0], stats["cache_misses"] - before[1]
        before = (stats["cache_hits"], stats["cache_misses"])
        rates.append(hits / (hits + misses) if hits + misses else 0.0)
    pss = _pss_of_job() if rank == 0 else 0
    cache_pss = _host_cache_pss() if rank == 0 else 0
    arena = loader._arena.resident_bytes() if loader._arena is not None else 0
    dist.barrier()  # every process alive while rank 0 measured
    stats = loader.stats()
    mine = {"rank": rank, "hit_rates": rates, "budget": stats["cache_budget_bytes"],
            "bytes": stats["cache_bytes"], "shared": stats["cache_shared"], "available": available,
            "arena_bytes": arena, "main_cpu_s": main_cpu, "worker_cpu_s": worker_cpu}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    loader.close()
    if rank == 0:
        print("RESULT " + json.dumps({"ranks": everyone, "node_images_per_s": node_rates, "pss": pss,
                                      "cache_pss": cache_pss,
                                      "images": len(dataset)}), flush=True)
    dist.destroy_process_group()


def _launch(script: str, ranks: int, mode: str, args: argparse.Namespace, root: str) -> dict:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(ranks),
           "--master_addr", "127.0.0.1", "--master_port", str(port), script, "--rank-main", "--mode", mode,
           "--workers", str(args.workers), "--batch-size", str(args.batch_size), "--epochs", str(args.epochs),
           "--cache-bytes", args.cache_bytes, root]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"torchrun failed ({mode}, {ranks} ranks):\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    line = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def _median_run(runs: list[dict]) -> dict:
    """The first run, with node images/s per epoch replaced by the medians over ``runs``."""
    import statistics

    epochs = range(len(runs[0]["node_images_per_s"]))
    rates = [statistics.median(r["node_images_per_s"][e] for r in runs) for e in epochs]
    return {**runs[0], "node_images_per_s": rates}


def _report(ranks: int, all_runs: dict[str, list[dict]], row_bytes: int) -> list[str]:
    lines = [f"-- {ranks} ranks ({len(all_runs['host'])} launches per mode; node images/s: medians) --"]
    runs = {mode: _median_run(found) for mode, found in all_runs.items()}
    base = runs["none"]["pss"]
    n = runs["host"]["images"]
    for mode in ("host", "rank"):
        run = runs[mode]
        hit = " | ".join(f"rank {r['rank']}: " + "/".join(f"{x:.2f}" for x in r["hit_rates"]) for r in run["ranks"])
        budgets = [r["budget"] for r in run["ranks"]]
        owned = budgets[0] if mode == "host" else sum(budgets)
        copies = (run["pss"] - base) / (n * row_bytes)
        lines.append(f"{mode:4s} hit rates per epoch {hit}")
        lines.append(f"{'':4s} node images/s per epoch {', '.join(f'{x:,.0f}' for x in run['node_images_per_s'])}"
                     f" | epoch {len(run['node_images_per_s'])}/1: "
                     f"{run['node_images_per_s'][-1] / run['node_images_per_s'][0]:.1f}x")
        lines.append(f"{'':4s} cache memory (PSS with - without) {(run['pss'] - base) / 2**20:,.0f} MiB = "
                     f"{copies:.2f} copies of the decoded rows | budget(s) {owned / 1e9:.2f} GB = "
                     f"{owned / run['ranks'][0]['available']:.2f} of available memory"
                     f" | same budget on every rank: {len(set(budgets)) == 1}")
        cpu = " | ".join(f"{name} " + "/".join(f"{sum(r[key][e] for r in run['ranks']):.2f}"
                                               for e in range(len(run["node_images_per_s"])))
                         for name, key in (("main", "main_cpu_s"), ("workers", "worker_cpu_s")))
        lines.append(f"{'':4s} CPU s per epoch, summed over ranks: {cpu}")
        arenas = sum(r["arena_bytes"] for r in run["ranks"]) - sum(r["arena_bytes"] for r in runs["none"]["ranks"])
        lines.append(f"{'':4s} of which: arenas (resident, with - without) {arenas / 2**20:+,.0f} MiB"
                     + (f"; the host cache's memfd pages (PSS) {run['cache_pss'] / (n * row_bytes):.2f} copies"
                        if mode == "host" else ""))
    host, rank = runs["host"]["node_images_per_s"], runs["rank"]["node_images_per_s"]
    pairs = [f"{h['node_images_per_s'][0] / r['node_images_per_s'][0]:.2f}"
             for h, r in zip(all_runs["host"], all_runs["rank"], strict=True)]
    lines.append(f"host/rank: epoch 1 {host[0] / rank[0]:.2f}x (per pair: {', '.join(pairs)}), "
                 f"last epoch {host[-1] / rank[-1]:.2f}x")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--cache-bytes", default="2GB")
    parser.add_argument("--repeats", type=int, default=2, help="launches per mode, alternating")
    parser.add_argument("--json")
    parser.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_main:
        rank_main(args)
        return
    import torch

    import gpufeed

    with tempfile.TemporaryDirectory() as tmp:
        root = args.root
        if root is None:
            from gpufeed.synth import make_image_folder

            root = os.path.join(tmp, "photos")
            make_image_folder(root, num_classes=10, per_class=max(1, args.images // 10),
                              size=((350, 500), (350, 500)), seed=0)
        load = os.getloadavg()
        head = (f"gpufeed {gpufeed.__file__} | torch {torch.__version__} | "
                f"{platform.processor() or platform.machine()} | {os.cpu_count()} cpus | load "
                f"{load[0]:.1f} | {args.workers} worker(s) per rank | batch {args.batch_size} | "
                f"cache_bytes {args.cache_bytes} | ResizeCenterCrop(224, 256) uint8")
        print(head, flush=True)
        results = {}
        for ranks in args.ranks:
            runs: dict[str, list[dict]] = {mode: [] for mode in MODES}
            order = [m for i in range(args.repeats) for m in (("host", "rank") if i % 2 == 0 else ("rank", "host"))]
            order.insert(2, "none")
            for mode in order:
                runs[mode].append(_launch(str(Path(__file__).resolve()), ranks, mode, args, root))
            results[ranks] = runs
            for line in _report(ranks, runs, 224 * 224 * 3):
                print(line, flush=True)
        print(f"load average at the end {os.getloadavg()[0]:.1f}", flush=True)
        if args.json:
            Path(args.json).write_text(json.dumps({"head": head, "results": results}))


if __name__ == "__main__":
    main()
