"""Parent CPU per batch: can the main process feed many workers?

    python -m benchmarks.parent_cpu [ROOT] [--images 1000] [--rounds 3] [--workers 2]
                                    [--batch-size 64] [--size 224 --resize 256] [--json OUT]

On a big machine the main process (dispatch, cache copies, reassembly of batches) must not become
the bottleneck. This measures CPU seconds, not wall time, so that a shared machine's other jobs
do not move the figures much:

* parent CPU per batch: ``time.process_time()`` of this process (all its threads) from the first
  batch received to the end of the epoch, over the batches after the first (start-up, including
  forking workers, is left out; ``parent+start`` in the table is the whole epoch from ``iter()``,
  start-up included). The consumer loop only counts batches (``n += 1``, well under 1 us);
* worker CPU per batch: user+system CPU of the worker processes (``loader.worker_pids()``,
  psutil) over the same epoch, divided by its batches;
* ``parent/worker``: parent CPU per batch over the *uncached* worker CPU per batch of the same
  pipeline (goal without a cache: < 3%, so that 32+ workers fit on paper), and ``x workers``: its
  inverse, how many workers' worth of batches the parent could take in (without a cache: the most
  workers it can feed; with full cache hits: the cached rate in uncached workers' units).

Cases: the image path (ImageFolder, demo JPEGs of ~400x350, eval ``ResizeCenterCrop(224, 256)``
and train ``RandomResizedCrop(224)``, batch 64, 2 workers), uint8 and normalized
float32 output, each without a cache and with full cache hits (``cache_bytes`` holding the whole
set, the epoch after the one that filled it), with ``persistent_workers`` True and False; and a
generic dataset of small tensors (3x32x32 uint8, label) for comparison, with torch's DataLoader
on it as a reference (``generic-dataloader``: its parent unpickles each batch from shared
memory). Each round builds every case's loader afresh, runs one uncounted epoch (start-up, cache
fill), then the measured one; figures are medians over ``--rounds`` rounds, cases alternating
within a round.

Without ROOT, the demo folder (./demo-data, made once with ``gpufeed.synth``, as
``e2e_images.py``) is used.

Private import: ``gpufeed._engine.arena.Arena``, whose ``_empty`` it times (``TrimClock``).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

from benchmarks._common import cpu_s_by_pid
from gpufeed import FastLoader, ImageFolder
from gpufeed._engine.arena import Arena
from gpufeed.cli.bench import prepare_demo_data
from gpufeed.compare._environment import describe_environment
from gpufeed.compare._images import make_transform

GOAL_RATIO = 0.03  # parent CPU per batch / worker CPU per batch, without a cache
IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
GENERIC_SHAPE = (3, 32, 32)


@dataclass(frozen=True)
class Case:
    """One loader configuration. ``cache``: the epoch measured is all cache hits."""

    name: str
    kind: str  # "eval" | "train" | "generic" | "generic-dataloader" (torch's DataLoader, reference)
    dtype: str  # "uint8" | "float32"
    cache: bool
    persistent: bool

    @property
    def baseline(self) -> str:
        """The uncached case whose worker CPU per batch this case is compared with."""
        return f"{self.kind} {self.dtype} no-cache"


@dataclass(frozen=True)
class Reading:
    """One measured epoch. CPU in seconds."""

    batches: float  # samples / batch_size (the last batch may be partial)
    after_first: float  # the same, without the first batch
    parent_s: float  # after the first batch
    parent_total_s: float  # from iter(), start-up included
    worker_s: float
    trim_s: float = 0.0  # parent CPU giving slot pages back after the first batch (part of parent_s)
    trims: int = 0  # slots emptied after the first batch (each one a refault for the worker that next writes it)
    worker_faults: int = 0  # the workers' page faults (minor + major) over the epoch
    wall_s: float = 0.0  # wall seconds after the first batch
    resident_mean: float = 0.0  # arena bytes resident, sampled at each batch after the first (mean)
    resident_peak: int = 0  # and the largest sample


class TrimClock:
    """Times ``Arena._empty`` in this process (the real method runs): every return of a free
    slot's pages to the OS (MADV_REMOVE), whether at a free (surplus) or in an idle trim while
    the parent waits for data. Its CPU is reported apart (see the README), and each emptied slot
    costs page faults in the worker that writes it next."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0
        self._original = Arena._empty

    def __enter__(self) -> TrimClock:
        original, clock = self._original, self

        def timed(arena: Arena, slot: int) -> None:
            t0 = time.process_time()
            try:
                original(arena, slot)
            finally:
                clock.seconds += time.process_time() - t0
                clock.calls += 1

        Arena._empty = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Arena._empty = self._original  # type: ignore[method-assign]


class SmallTensors(Dataset):
    """Generic path: sample ``i`` is a 3x32x32 uint8 tensor of ``i % 256`` and label ``i``."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full(GENERIC_SHAPE, index % 256, dtype=torch.uint8), index


def cases() -> list[Case]:
    out = []
    for kind in ("eval", "train"):
        for dtype in ("uint8", "float32"):
            for cache, persistent in ((False, True), (False, False), (True, True), (True, False)):
                label = "cache-hit" if cache else "no-cache"
                name = f"{kind} {dtype} {label}" + ("" if persistent else " non-persistent")
                if not cache and persistent:
                    name = f"{kind} {dtype} no-cache"
                out.append(Case(name, kind, dtype, cache, persistent))
    out.append(Case("generic uint8 no-cache", "generic", "uint8", False, True))
    out.append(Case("generic-dataloader uint8 no-cache", "generic-dataloader", "uint8", False, True))
    return out


def _faults_of(pid: int) -> int:
    """Minor + major page faults of ``pid`` so far (Linux ``/proc/PID/stat``; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[7]) + int(fields[9])  # minflt, majflt (fields 10 and 12 of stat)


def _cpu_of(pids: Iterable[int], seen: dict[int, float], faults: dict[int, int] | None = None) -> None:
    """Record each live pid's user+system CPU seconds, and page faults (the last reading wins)."""
    for pid, cpu_s in cpu_s_by_pid(pids).items():
        seen[pid] = cpu_s
        if faults is not None:
            faults[pid] = _faults_of(pid)


def worker_pids(loader: Any) -> list[int]:
    """FastLoader's ``worker_pids()``; a torch DataLoader's persistent iterator's workers."""
    pids = getattr(loader, "worker_pids", None)
    if callable(pids):
        return list(pids())
    return [w.pid for w in getattr(getattr(loader, "_iterator", None), "_workers", ()) if w.pid is not None]


def measure_epoch(loader: Any, trims: TrimClock) -> Reading:
    """Iterate one epoch of ``loader``; parent and worker CPU seconds (see the module doc)."""
    before: dict[int, float] = {}
    faults_before: dict[int, int] = {}
    _cpu_of(worker_pids(loader), before, faults_before)  # persistent workers: their CPU so far
    gc.collect()
    t_start = time.process_time()
    t_first = t_start
    wall_first = time.perf_counter()
    n = samples = first = 0
    after: dict[int, float] = {}
    faults_after: dict[int, int] = {}
    resident: list[int] = []
    sampling_s = 0.0  # CPU spent sampling the arena's resident bytes: not the loader's
    for _, labels in loader:
        n += 1
        samples += len(labels)
        if n == 1:
            t_first, first, wall_first = time.process_time(), samples, time.perf_counter()
            trim_s, trim_calls = trims.seconds, trims.calls
        else:
            t0 = time.process_time()
            arena = getattr(loader, "_arena", None)  # FastLoader's (None for torch's DataLoader)
            if arena is not None:
                resident.append(arena.resident_bytes())
            sampling_s += time.process_time() - t0
        if n % 4 == 0:  # non-persistent workers exit after the epoch: read them while alive
            t0 = time.process_time()
            _cpu_of(worker_pids(loader), after, faults_after)
            sampling_s += time.process_time() - t0
    t_end, wall_end = time.process_time(), time.perf_counter()
    _cpu_of(worker_pids(loader), after, faults_after)
    worker_s = sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())
    worker_faults = sum(f - faults_before.get(pid, 0) for pid, f in faults_after.items())
    if n < 2:
        raise ValueError(f"an epoch gave {n} batch(es); need at least 2 (more images, smaller --batch-size)")
    size = loader.batch_size or 1
    return Reading(samples / size, (samples - first) / size, t_end - t_first - sampling_s,
                   t_end - t_start - sampling_s, worker_s, trims.seconds - trim_s, trims.calls - trim_calls,
                   worker_faults, wall_end - wall_first, statistics.fmean(resident) if resident else 0.0,
                   max(resident, default=0))


def make_factory(case: Case, root: Path, args: argparse.Namespace) -> Callable[[], Any]:
    common: dict[str, Any] = dict(batch_size=args.batch_size, num_workers=args.workers,
                                  persistent_workers=case.persistent, shuffle=case.kind == "train",
                                  generator=torch.Generator().manual_seed(0))
    if case.kind.startswith("generic"):
        generic = SmallTensors(args.generic_samples)
        if case.kind == "generic-dataloader":
            return lambda: DataLoader(generic, **common)
        return lambda: FastLoader(generic, **common)
    dataset = ImageFolder(root, transform=make_transform(case.kind, size=args.size, resize=args.resize))
    image: dict[str, Any] = {"seed": 0}
    if case.dtype == "float32":
        image["normalize"] = IMAGENET
    if case.cache:
        image["cache_bytes"] = 1 << 40  # holds the set; the cache only takes what it is given
    return lambda: FastLoader(dataset, **common, **image)


def run_round(case: Case, factory: Callable[[], Any]) -> Reading:
    """A fresh loader: one uncounted epoch (start-up, cache fill), then the measured one."""
    loader = factory()
    try:
        for _ in loader:
            pass
        hits = loader.stats().get("cache_hits", 0) if case.cache else 0
        with TrimClock() as trims:
            reading = measure_epoch(loader, trims)
        if case.cache:
            stats = loader.stats()
            if stats["cache_hits"] - hits != len(loader.dataset):
                raise RuntimeError(f"{case.name}: the measured epoch was not all cache hits: "
                                   f"{stats['cache_hits'] - hits} hits, {len(loader.dataset)} samples")
        return reading
    finally:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
        else:  # torch's DataLoader: stop its persistent workers now
            it = getattr(loader, "_iterator", None)
            if it is not None:
                it._shutdown_workers()
        del loader
        gc.collect()


def summarize(results: dict[str, list[Reading]], all_cases: list[Case],
              batch_bytes: dict[str, int], size: int) -> list[dict[str, Any]]:
    """One row per case (medians over rounds); ``size``: the batch size (for images/s)."""
    rows = []
    for case in all_cases:
        readings = results[case.name]
        parent = statistics.median(r.parent_s / r.after_first for r in readings)
        trim = statistics.median(r.trim_s / r.after_first for r in readings)
        kept = statistics.median((r.parent_s - r.trim_s) / r.after_first for r in readings)
        parent_total = statistics.median(r.parent_total_s / r.batches for r in readings)
        worker = statistics.median(r.worker_s / r.batches for r in readings)
        base = results.get(case.baseline, readings)
        base_worker = statistics.median(r.worker_s / r.batches for r in base)
        pairs = [(r, b.worker_s / b.batches) for r, b in zip(readings, base) if b.worker_s > 0]
        ratio = statistics.median(r.parent_s / r.after_first / w for r, w in pairs) if pairs else float("nan")
        ratio_kept = (statistics.median((r.parent_s - r.trim_s) / r.after_first / w for r, w in pairs)
                      if pairs else float("nan"))
        rows.append({
            **asdict(case),
            "batches": readings[0].batches,
            "rounds": len(readings),
            "parent_cpu_ms_per_batch": parent * 1e3,
            "parent_cpu_with_startup_ms_per_batch": parent_total * 1e3,
            "trim_cpu_ms_per_batch": trim * 1e3,
            "slots_emptied_per_batch": statistics.median(r.trims / r.after_first for r in readings),
            "parent_cpu_without_trims_ms_per_batch": kept * 1e3,
            "worker_cpu_ms_per_batch": worker * 1e3,
            "worker_faults_per_batch": statistics.median(r.worker_faults / r.batches for r in readings),
            "resident_batches_mean": statistics.median(r.resident_mean for r in readings) / batch_bytes[case.name],
            "resident_batches_peak": statistics.median(r.resident_peak for r in readings) / batch_bytes[case.name],
            "images_per_s": statistics.median(r.after_first * size / r.wall_s if r.wall_s > 0 else float("nan")
                                              for r in readings),
            "uncached_worker_cpu_ms_per_batch": base_worker * 1e3,
            "parent_over_worker": ratio,
            "max_workers": 1.0 / ratio if ratio > 0 else float("inf"),
            "parent_over_worker_without_trims": ratio_kept,
            "max_workers_without_trims": 1.0 / ratio_kept if ratio_kept > 0 else float("inf"),
            "batch_bytes": batch_bytes[case.name],
            "parent_mb_per_s": batch_bytes[case.name] / parent / 1e6 if parent > 0 else float("inf"),
            "goal_met": (ratio < GOAL_RATIO) if not case.cache else None,
            "goal_met_without_trims": (ratio_kept < GOAL_RATIO) if not case.cache else None,
        })
    return rows


def memcpy_mb_per_s(nbytes: int, chunks: int = 16, repeats: int = 48) -> float:
    """This process's single-thread copy rate of ``nbytes`` (MB/s, CPU time, median of
    ``repeats``), from a source of ``chunks`` such blocks (larger than the CPU's caches, as the
    cache's rows are) into two alternating warm blocks (as slots): the ceiling of a cache hit's
    row copies."""
    src = torch.randint(0, 256, (chunks, nbytes), dtype=torch.uint8).numpy()
    dst = src[:2].copy()
    rates = []
    for i in range(repeats):
        t0 = time.process_time()
        dst[i % 2] = src[(7 * i) % chunks]
        dt = time.process_time() - t0
        if dt > 0:
            rates.append(nbytes / dt / 1e6)
    return statistics.median(rates) if rates else float("nan")


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'case':<36} {'parent ms':>9} {'trim ms':>7} {'emptied':>7} {'parent+start':>12} {'worker ms':>9} "
            f"{'faults':>7} {'parent/worker':>13} {'w/o trims':>9} {'x workers':>9} {'w/o trims':>9} {'img/s':>6} "
            f"{'resident':>8}")
    lines = [head]
    for r in rows:
        lines.append(f"{r['name']:<36} {r['parent_cpu_ms_per_batch']:>9.3f} {r['trim_cpu_ms_per_batch']:>7.3f} "
                     f"{r['slots_emptied_per_batch']:>7.2f} "
                     f"{r['parent_cpu_with_startup_ms_per_batch']:>12.3f} {r['worker_cpu_ms_per_batch']:>9.2f} "
                     f"{r['worker_faults_per_batch']:>7.0f} "
                     f"{100 * r['parent_over_worker']:>12.2f}% {100 * r['parent_over_worker_without_trims']:>8.2f}% "
                     f"{r['max_workers']:>9.1f} {r['max_workers_without_trims']:>9.1f} {r['images_per_s']:>6.0f} "
                     f"{r['resident_batches_mean']:>4.1f}/{r['resident_batches_peak']:<3.1f}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    """The command line: every option and its default."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("root", nargs="?", help="image folder (ROOT/CLASS/IMAGE); default: the demo folder")
    parser.add_argument("--dir", default="demo-data", help="demo folder to make/reuse without ROOT")
    parser.add_argument("--images", type=int, default=1000, help="demo images to make (without ROOT)")
    parser.add_argument("--generic-samples", type=int, default=20000,
                        help="the generic dataset's length (its workers' CPU is read in 10 ms ticks)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--size", type=int, default=224, help="output crop (pixels)")
    parser.add_argument("--resize", type=int, default=256, help="eval: shorter side before the crop")
    parser.add_argument("--only", default="", help="comma-separated substrings: run the cases whose "
                        "name contains one (their uncached baselines are added)")
    parser.add_argument("--json", help="write the result here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.workers < 1:
        parser.error("--rounds and --workers must be >= 1")

    if args.root:
        root = Path(args.root)
    else:
        root, count, reused = prepare_demo_data(args.dir, args.images)
        print(f"no ROOT given: {'using' if reused else 'made'} {root} ({count} images)")
    all_cases = cases()
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        picked = {c.name for c in all_cases if any(w in c.name for w in wanted)}
        picked |= {c.baseline for c in all_cases if c.name in picked}
        all_cases = [c for c in all_cases if c.name in picked]
    env = describe_environment(num_workers=args.workers)
    cores = psutil.cpu_count(logical=True)
    print(f"machine: {env.get('cpu_model', env.get('cpu', 'n/a'))}, {cores} logical cores, "
          f"{env.get('usable_cores', '?')} usable; a shared machine (other jobs may run): figures "
          f"are CPU seconds, not wall time")
    print(f"{len(ImageFolder(root))} images in {root}, batch {args.batch_size}, {args.workers} workers, "
          f"{args.rounds} round(s), medians")

    factories = {c.name: make_factory(c, root, args) for c in all_cases}
    results: dict[str, list[Reading]] = {c.name: [] for c in all_cases}
    t0 = time.perf_counter()
    for rnd in range(args.rounds):
        for case in all_cases:
            results[case.name].append(run_round(case, factories[case.name]))
        print(f"round {rnd + 1}/{args.rounds} done ({time.perf_counter() - t0:.0f} s)", flush=True)

    pixels = args.size * args.size * 3 * args.batch_size
    batch_bytes = {c.name: (int(torch.tensor(GENERIC_SHAPE).prod()) * args.batch_size if c.kind.startswith("generic")
                            else pixels * (4 if c.dtype == "float32" else 1)) for c in all_cases}
    rows = summarize(results, all_cases, batch_bytes, args.batch_size)
    memcpy = memcpy_mb_per_s(pixels)
    print()
    print(format_table(rows))
    print("parent ms: parent CPU per batch after the first batch (trim ms of it: giving free slots' pages "
          "back, MADV_REMOVE; emptied: slots emptied per batch, each a refault for the worker that writes it "
          "next); parent+start: per batch from iter(), start-up included; worker ms: all workers' CPU per "
          "batch (faults: their page faults per batch); parent/worker: parent ms over the uncached worker ms "
          "of the same pipeline (w/o trims: without the trims); x workers: its inverse; img/s: wall-clock "
          "rate after the first batch; resident: the arena's resident bytes in batches, mean/peak of a "
          "sample at each batch")
    for r in rows:
        if r["cache"] and r["kind"] == "eval" and r["dtype"] == "uint8":
            print(f"{r['name']}: the parent copies {r['parent_mb_per_s']:.0f} MB of batch per CPU second, "
                  f"{r['parent_mb_per_s'] / memcpy:.0%} of this process's memcpy ({memcpy:.0f} MB/s, "
                  f"{pixels / 1e6:.1f} MB buffers)")
    uncached = [r for r in rows if not r["cache"] and not r["kind"].startswith("generic")]
    for key, label in (("parent_over_worker", "all parent CPU"),
                       ("parent_over_worker_without_trims", "without trims")):
        if not uncached:
            break
        worst = max(uncached, key=lambda r: r[key])
        met = all(r[key] < GOAL_RATIO for r in uncached)
        print(f"goal (image path, no cache: parent CPU < {100 * GOAL_RATIO:.0f}% of a worker's per batch), "
              f"{label}: {'met' if met else 'NOT met'}; worst {worst['name']}: {100 * worst[key]:.2f}% "
              f"({1 / worst[key]:.0f} workers on paper)")
    if args.json:
        out = {"benchmark": "parent_cpu", "root": str(root), "images": len(ImageFolder(root)),
               "batch_size": args.batch_size, "num_workers": args.workers, "rounds": args.rounds,
               "goal_ratio": GOAL_RATIO, "shared_machine": True, "logical_cores": cores,
               "memcpy_mb_per_s": memcpy, "generic_samples": args.generic_samples,
               "environment": env, "rows": rows,
               "readings": {k: [asdict(r) for r in v] for k, v in results.items()}}
        Path(args.json).write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
