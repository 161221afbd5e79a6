"""Core scaling of the image path: images/s at 1, 2, 4, 8, 16 workers.

    python -m benchmarks.core_scaling [--workers 1,2,4,8,16] [--images 512] [--batch-size 64]
                                      [--seconds 2.5] [--rounds 3] [--budget-s 110] [--dir DIR]
                                      [--size 224 --resize 256] [--json OUT]

``FastLoader(ImageFolder(demo JPEGs of ~400x350, ResizeCenterCrop(224, 256)))``, uint8 output, no
cache, batch 64, ``persistent_workers=False``, for each worker count (capped at the usable cores:
affinity and cgroup quota) plus the goal's count (usable cores - 1: the main process keeps one) when
it is not in the list. The demo images (``gpufeed.cli.bench.prepare_demo_data``, made once in
``--dir``) are cycled (sample ``i`` is image ``i % n``), so a few hundred files keep 16 workers busy
for as long as a measurement lasts; after the first pass they come from the page cache.

One measurement: a fresh loader; the clock starts when ``num_workers`` batches have arrived (every
worker has started and delivered) and runs for ``--seconds``; images/s = images received in that
window / its length. The parent's CPU (``time.process_time``) and the workers' (psutil) over the
window are reported as cores busy. Rounds alternate the order of the counts (ascending, then
descending, ...); a round after the first runs only when it fits in ``--budget-s`` (seconds since
start, image making included). Figures are medians over rounds.

Scaling efficiency at k workers = images/s(k) / (k x images/s(1)). Goal: >= 85% at the
usable cores - 1 workers. The CPU topology is reported: logical CPUs, physical cores, threads per
core (``/sys/devices/system/cpu/cpu*/topology/thread_siblings_list``, and ``lscpu`` if present), so
that the result says whether the cores are hyperthreads.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch.utils.data import Sampler

from benchmarks._common import cpu_s_by_pid
from gpufeed import FastLoader, ImageFolder
from gpufeed.cli.bench import prepare_demo_data
from gpufeed.compare._environment import describe_environment
from gpufeed.image import ResizeCenterCrop
from gpufeed.tune import usable_cores

GOAL = 0.85  # efficiency at usable cores - 1 workers
DEFAULT_COUNTS = (1, 2, 4, 8, 16)


class Cycle(Sampler[int]):
    """``length`` indices ``0, 1, ..., n - 1, 0, 1, ...``: a small folder, a long epoch."""

    def __init__(self, n: int, length: int) -> None:
        self.n, self.length = n, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        n = self.n
        return (i % n for i in range(self.length))


def topology(root: str = "/sys/devices/system/cpu") -> dict[str, Any]:
    """Logical CPUs this process may use, physical cores among them and threads per core, from
    sysfs ``thread_siblings_list``; ``hyperthreads`` is True when some core runs two or more of
    them, None when the topology cannot be read."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    siblings: set[str] = set()
    unread = 0
    for cpu in cpus:
        try:
            with open(f"{root}/cpu{cpu}/topology/thread_siblings_list", encoding="ascii") as f:
                siblings.add(f.read().strip())
        except OSError:
            unread += 1
    per_core = [len(_cpu_list(s)) for s in siblings]
    out: dict[str, Any] = {
        "logical_cpus": len(cpus),
        "usable_cores": usable_cores(),
        "physical_cores": len(siblings) if not unread else None,
        "threads_per_core": max(per_core) if per_core and not unread else None,
        "hyperthreads": (max(per_core) > 1) if per_core and not unread else None,
        "source": "sysfs thread_siblings_list" if not unread else f"unreadable for {unread} CPU(s)",
        "lscpu": lscpu(),
    }
    return out


def _cpu_list(text: str) -> list[int]:
    """'0-3,8' -> [0, 1, 2, 3, 8] (the kernel's CPU list format)."""
    out: list[int] = []
    for part in text.split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def lscpu() -> dict[str, str]:
    """The topology lines of ``lscpu`` (empty when it is not installed)."""
    if shutil.which("lscpu") is None:
        return {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keep = ("Model name", "Thread(s) per core", "Core(s) per socket", "Socket(s)", "CPU(s)",
            "On-line CPU(s) list", "Hypervisor vendor", "Virtualization type")
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in keep:
            out[key.strip()] = value.strip()
    return out


def counts_to_run(wanted: list[int], usable: int) -> tuple[list[int], int]:
    """(worker counts to measure, the goal's count): ``wanted`` capped at ``usable``, 1 always in
    (the base of every efficiency), and the goal's count ``usable - 1`` (at least 1) added."""
    goal_k = max(1, usable - 1)
    counts = sorted({1, goal_k, *(k for k in wanted if 1 <= k <= usable)})
    return counts, goal_k


def measure(root: Path, workers: int, args: argparse.Namespace, num_images: int) -> dict[str, float]:
    """One fresh loader at ``workers``: images/s over ``--seconds`` after every worker delivered."""
    dataset = ImageFolder(str(root), transform=ResizeCenterCrop(args.size, args.resize))
    per_s_guess = 4000 * workers  # an upper bound per worker; the window ends on time anyway
    sampler = Cycle(len(dataset), int(per_s_guess * (args.seconds + 30)))
    loader = FastLoader(dataset, batch_size=args.batch_size, sampler=sampler, num_workers=workers)
    iterator = iter(loader)
    try:
        received = images = 0
        t0 = cpu0 = 0.0
        workers0: dict[int, float] = {}
        start = time.perf_counter()
        for _, labels in iterator:
            received += 1
            now = time.perf_counter()
            if received == workers:  # every worker has delivered a batch: the clock starts
                t0, cpu0 = now, time.process_time()
                workers0 = cpu_s_by_pid(loader.worker_pids())
                continue
            if received > workers:
                images += len(labels)
                if now - t0 >= args.seconds:
                    break
            if now - start > args.seconds + 120:
                raise TimeoutError(f"{workers} worker(s): {received} batches in {now - start:.0f} s, "
                                   "no steady window; the machine is overloaded or the loader stalled")
        wall = time.perf_counter() - t0
        parent_s = time.process_time() - cpu0
        workers1 = cpu_s_by_pid(loader.worker_pids())
    finally:
        iterator.close()  # type: ignore[attr-defined]
        loader.close()
    worker_s = sum(workers1[p] - workers0.get(p, 0.0) for p in workers1)
    return {
        "workers": workers, "images": images, "seconds": wall, "images_per_s": images / wall,
        "parent_cores": parent_s / wall, "worker_cores": worker_s / wall,
        "worker_busy": worker_s / wall / workers,
    }


def summarize(rounds: list[list[dict[str, float]]], counts: list[int], goal_k: int) -> dict[str, Any]:
    """Medians per count over rounds; efficiency against the 1-worker median; the goal line."""
    rows = []
    med = {k: statistics.median(m["images_per_s"] for r in rounds for m in r if m["workers"] == k) for k in counts}
    base = med[1]
    for k in counts:
        ms = [m for r in rounds for m in r if m["workers"] == k]
        rows.append({
            "workers": k, "images_per_s": med[k], "per_round": [m["images_per_s"] for m in ms],
            "speedup": med[k] / base, "efficiency": med[k] / (k * base),
            "parent_cores": statistics.median(m["parent_cores"] for m in ms),
            "worker_busy": statistics.median(m["worker_busy"] for m in ms),
        })
    eff = med[goal_k] / (goal_k * base)
    met = eff >= GOAL if goal_k > 1 else None  # 1 worker is the base itself: nothing to judge
    return {"rows": rows, "goal": {"workers": goal_k, "efficiency": eff, "target": GOAL, "met": met}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workers", default=",".join(map(str, DEFAULT_COUNTS)),
                   help="comma list of worker counts (capped at the usable cores; 1 and usable - 1 added)")
    p.add_argument("--images", type=int, default=512, help="distinct demo JPEGs (~400x350; made once, cycled)")
    p.add_argument("--dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "gpufeed-core-scaling")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--size", type=int, default=224, help="crop (pixels)")
    p.add_argument("--resize", type=int, default=256, help="shorter side before the crop (pixels)")
    p.add_argument("--seconds", type=float, default=2.5, help="measured window per loader (seconds)")
    p.add_argument("--rounds", type=int, default=3, help="rounds at most (each measures every count once)")
    p.add_argument("--budget-s", type=float, default=110.0,
                   help="a round after the first starts only if it should end within this many seconds of start")
    p.add_argument("--json", type=Path, default=None,
                   help="write the figures here (also what was measured when cut short by SIGTERM)")
    p.add_argument("--require-goals", action="store_true",
                   help="exit 1 unless the efficiency goal was judged and met")
    args = p.parse_args(argv)
    started = time.perf_counter()
    try:
        wanted = [int(x) for x in args.workers.split(",") if x.strip()]
    except ValueError:
        print(f"core_scaling.py: --workers must be a comma list of ints. Found: {args.workers!r}", file=sys.stderr)
        return 2
    topo = topology()
    counts, goal_k = counts_to_run(wanted, topo["usable_cores"])
    root, num_images, reused = prepare_demo_data(args.dir, args.images)
    made_s = time.perf_counter() - started
    ht = {True: "yes", False: "no", None: "unknown"}[topo["hyperthreads"]]
    print(f"core scaling: {topo['logical_cpus']} logical CPUs usable ({topo['usable_cores']} by affinity and "
          f"quota), {topo['physical_cores']} physical cores, {topo['threads_per_core']} thread(s) per core: "
          f"hyperthreads {ht} ({topo['source']}); lscpu: {topo['lscpu'] or 'n/a'}")
    print(f"{num_images} demo JPEGs in {root} ({'reused' if reused else f'made in {made_s:.1f} s'}), cycled; "
          f"ResizeCenterCrop({args.size}, {args.resize}), uint8, batch {args.batch_size}, no cache; "
          f"workers {counts}; {args.seconds:g} s per measurement after every worker delivered")
    sys.stdout.flush()
    rounds: list[list[dict[str, float]]] = []
    try:
        signal.signal(signal.SIGTERM, _terminated)
        _measure_rounds(args, root, counts, num_images, started, rounds)
    except BaseException as exc:
        print(f"core scaling: cut short ({type(exc).__name__}: {exc}) after {len(rounds)} complete round(s)")
        if args.json:
            args.json.write_text(json.dumps({"topology": topo, "counts": counts, "rounds": rounds,
                                             "cut_short": f"{type(exc).__name__}: {exc}"}, indent=2))
        raise
    return _report(args, topo, counts, goal_k, rounds, num_images, ht, started)


class Terminated(BaseException):
    """SIGTERM arrived (a time limit): the rounds measured so far still reach --json."""


def _terminated(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum} (SIGTERM)")


def _measure_rounds(args: argparse.Namespace, root: Path, counts: list[int], num_images: int, started: float,
                    rounds: list[list[dict[str, float]]]) -> None:
    """Append each complete round to ``rounds`` (the order alternates), within ``--budget-s``."""
    round_s = 0.0
    for r in range(args.rounds):
        if r and time.perf_counter() - started + round_s > args.budget_s:
            print(f"budget: round {r + 1} skipped (a round takes ~{round_s:.0f} s; --budget-s {args.budget_s:g})")
            break
        t_round = time.perf_counter()
        order = counts if r % 2 == 0 else counts[::-1]
        this: list[dict[str, float]] = []
        for k in order:
            m = measure(root, k, args, num_images)
            this.append(m)
            print(f"round {r + 1}: {k:3d} worker(s) {m['images_per_s']:9.0f} images/s  parent {m['parent_cores']:.2f} "
                  f"cores  workers busy {m['worker_busy']:.0%}")
            sys.stdout.flush()
        rounds.append(this)
        round_s = time.perf_counter() - t_round


def _report(args: argparse.Namespace, topo: dict[str, Any], counts: list[int], goal_k: int,
            rounds: list[list[dict[str, float]]], num_images: int, ht: str, started: float) -> int:
    """Print the table and the goal, write --json; the exit status."""
    result = summarize(rounds, counts, goal_k)
    print(f"\n{'workers':>7} {'images/s':>9} {'speedup':>8} {'efficiency':>10} {'parent cores':>12} "
          f"{'worker busy':>11}  (medians of {len(rounds)} round(s))")
    for row in result["rows"]:
        print(f"{row['workers']:7d} {row['images_per_s']:9.0f} {row['speedup']:7.2f}x {row['efficiency']:10.0%} "
              f"{row['parent_cores']:12.2f} {row['worker_busy']:11.0%}")
    g = result["goal"]
    verdict = {True: "met", False: "NOT met",
               None: "not judged (the base count itself: needs >= 3 usable cores)"}[g["met"]]
    print(f"goal: efficiency >= {GOAL:.0%} at {g['workers']} workers (usable cores "
          f"{topo['usable_cores']} - 1 for the main process), against {g['workers']} x the 1-worker rate: "
          f"{g['efficiency']:.0%}, {verdict}; hyperthreads: {ht}")
    if args.json:
        out = {"topology": topo, "counts": counts, "rounds": rounds, **result,
               "settings": {"images": num_images, "batch_size": args.batch_size, "size": args.size,
                            "resize": args.resize, "seconds": args.seconds, "transform": "eval", "dtype": "uint8"},
               "environment": describe_environment(max(counts)), "elapsed_s": time.perf_counter() - started}
        args.json.write_text(json.dumps(out, indent=2))
    if args.require_goals and g["met"] is not True:
        print("core scaling: --require-goals: the goal was " + ("not met" if g["met"] is False else "not judged"))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
