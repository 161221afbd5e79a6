"""Why is the GPU waiting? ``diagnose(loader, step)`` names what limits a training loop.

It runs the loader for a number of batches, calls the training step on each, and measures at
once: the loader's own stage timings and data wait (``FastLoader.stats()``), the CPU time of the
training process and of each worker, the system's idle and iowait time, the workers' thread
states (running, blocked, uninterruptible I/O) and the step's time. It then keeps a few batches
and replays the step on them without the loader, which shows what the step costs alone.

The verdict comes from :func:`decide`, a pure function of the :class:`Evidence`:

* ``"compute"``: the step rarely waited for data, the first batch of each epoch aside (it starts
  from an empty queue; reported separately), and the replay is not meaningfully faster than the
  run: the loader keeps up; the model step is what to optimize.
* otherwise the loader starves the step, and the workers show why:

  - ``"transfer"``: host-to-device copies (``h2d_s``, with ``device=``) take most of the time;
  - ``"read"``: workers are mostly blocked, not computing, and reading takes the largest share
    of their time, or iowait / D-state (disk) is high: storage;
  - ``"workers"``: workers are CPU-bound while cores sit idle: more workers would go faster
    (also: ``num_workers=0``, or workers idle while the step waits, e.g. start-up each epoch);
  - ``"decode"`` / ``"transform"``: workers are CPU-bound and no core is idle: the dominant
    CPU stage is the cost (image path: decode vs crop/resize/normalize; a generic dataset's
    ``__getitem__`` and ``collate_fn`` count as ``"transform"``: Python preprocessing).

Running vs blocked comes from sampling the state of each worker's main thread (Linux
``/proc``): a CPU-bound worker is R (running, or runnable but preempted when other processes
compete for the cores), a worker waiting on storage is S or D. This tells "slow storage" from
"CPU-starved" even on a busy machine, where CPU percentages alone cannot.

The process-level signals are the ones an engineer would read from ``top``, ``vmstat`` and
``/proc`` by hand, taken over the same window as the loader's stage timings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from gpufeed._observe.memory import format_bytes
from gpufeed._observe.probe import ProbeResult, TreeProbe
from gpufeed.errors import shorten
from gpufeed.stats import STAGES

__all__ = ["BOTTLENECKS", "Evidence", "Report", "decide", "diagnose"]

BOTTLENECKS = ("read", "decode", "transform", "workers", "transfer", "compute", "cache")

# Thresholds of the decision (fractions unless named otherwise).
WAIT_OK = 0.10  # data wait below this share of the run: the loader keeps up
REPLAY_SAME = 0.85  # replay step time >= this x the run's time per batch: not meaningfully faster
CPU_BOUND = 0.60  # workers running (R) at least this share of samples: CPU-bound
READ_SHARE = 0.40  # read takes at least this share of worker stage time: storage-bound
IOWAIT_HIGH = 0.15  # share of usable CPU time idle in iowait
DSTATE_HIGH = 0.25  # share of worker samples with a thread in D (uninterruptible I/O)
BLOCKED = 0.50  # share of samples a worker's main thread waited (S/D)
BUSY_LOW = 0.50  # workers inside a stage less than this share of the time: they are idle
SPARE_CORES = 0.50  # idle cores needed to call for more workers (cores)
TRANSFER_SHARE = 0.50  # h2d seconds per wall second that make the copy the limit


@dataclass(frozen=True)
class Evidence:
    """What :func:`diagnose` measured over its window (after warm-up). Seconds are wall seconds
    unless noted; CPU figures are fractions of one core (1.0 = one core fully busy).

    Stage seconds are the loader's worker-side timings summed over workers (see
    ``FastLoader.stats()``); on the image path ``fetch_s`` equals ``read_s``.
    """

    batches: int  # batches measured
    wall_s: float  # duration of the measured window
    wait_s: float  # time the consumer blocked in ``next()``
    step_s: float  # time in the step, summed over batches
    num_workers: int
    usable_cores: float  # CPUs this process may use (affinity, cgroup quota)
    image_path: bool = False  # the loader took gpufeed's image fast path
    samples: int = 0
    fetch_s: float = 0.0
    read_s: float = 0.0
    decode_s: float = 0.0
    transform_s: float = 0.0
    collate_s: float = 0.0
    pack_s: float = 0.0
    h2d_s: float = 0.0  # host-to-device copy time (device=), CUDA-event timed
    queue_depth_mean: float = 0.0  # ready batches when the consumer asked, mean
    queue_capacity: int = 0  # batches in flight at most (prefetch_factor x num_workers)
    worker_cpu: tuple[float, ...] = ()  # per worker id (its pids summed): CPU over the window
    main_cpu: float = 0.0  # the training process (loader + step)
    idle_cores: float = 0.0  # cores left idle (incl. iowait) on the usable CPUs, mean
    other_cores: float = 0.0  # cores busy outside this process tree, mean
    iowait_fraction: float = 0.0  # share of usable CPU time in iowait
    worker_running: float | None = None  # share of samples a worker's main thread was R
    worker_blocked: float | None = None  # ... was S or D (waiting)
    dstate_fraction: float | None = None  # share of samples a worker had a thread in D
    state_samples: int = 0  # (sample, worker) thread-state readings
    replay_batches: int = 0  # batches kept and replayed through the step without the loader
    replay_step_s: float | None = None  # mean step time per replayed batch
    cache_hit_rate: float | None = None  # image path with cache_bytes: hits / look-ups
    parent_batches: int = 0  # batches the main process made itself (every row a cache hit)
    parent_s: float = 0.0  # main-process seconds spent on those (not in the stage seconds)
    epoch_starts: int = 0  # epochs that began inside the window (new iterators)
    epoch_start_wait_s: float = 0.0  # wait for the first batch of those epochs
    stored_short_side_px: float | None = None  # image sources: mean shorter side as stored
    output_side_px: int | None = None  # image path: the transform's longer output side
    deterministic: bool | None = None  # image path: the transform is (eval: cacheable decoded)
    read_concurrency: int | None = None  # image sources: reads in flight per worker
    read_budget_bytes: int | None = None  # image sources: bytes read and not decoded, per worker
    fetch_threads: int = 0  # generic path: the dataset's fetch_threads (0: one sample at a time)

    # -- derived -------------------------------------------------------------------------------
    @property
    def data_wait_fraction(self) -> float:
        """Share of the window the consumer waited for data."""
        return min(1.0, self.wait_s / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def steady_wait_fraction(self) -> float:
        """Share of the window the consumer waited, leaving out the first batch of each epoch
        (which starts with an empty queue)."""
        if self.wall_s <= 0:
            return 0.0
        return min(1.0, max(0.0, self.wait_s - self.epoch_start_wait_s) / self.wall_s)

    @property
    def batch_s(self) -> float:
        """Wall seconds per batch in the run (step + wait + overhead)."""
        return self.wall_s / self.batches if self.batches else 0.0

    @property
    def step_mean_s(self) -> float:
        """Mean step time per batch in the run."""
        return self.step_s / self.batches if self.batches else 0.0

    @property
    def stage_total_s(self) -> float:
        """Worker seconds in the loader's stages (fetch counted once on the image path)."""
        if self.image_path:
            return self.read_s + self.decode_s + self.transform_s + self.collate_s + self.pack_s
        return self.fetch_s + self.collate_s + self.pack_s

    @property
    def shares(self) -> dict[str, float]:
        """Each stage's share of the worker stage time (image path: read/decode/transform;
        generic: fetch/collate); ``pack`` is the engine's own cost."""
        total = self.stage_total_s
        if total <= 0:
            return {}
        if self.image_path:
            parts = {"read": self.read_s, "decode": self.decode_s,
                     "transform": self.transform_s + self.collate_s, "pack": self.pack_s}
        else:
            parts = {"fetch": self.fetch_s, "collate": self.collate_s, "pack": self.pack_s}
        return {k: v / total for k, v in parts.items()}

    @property
    def worker_busy(self) -> float:
        """Share of the window the workers spent inside a stage (1.0: never idle)."""
        if self.num_workers == 0 or self.wall_s <= 0:
            return 0.0
        return min(1.0, self.stage_total_s / (self.num_workers * self.wall_s))

    @property
    def worker_cpu_mean(self) -> float:
        """Mean CPU per worker (fraction of a core): total worker CPU / num_workers / wall."""
        return sum(self.worker_cpu) / self.num_workers if self.num_workers else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The fields and the derived figures, JSON-able."""
        out = asdict(self)
        out["worker_cpu"] = list(self.worker_cpu)
        for name in ("data_wait_fraction", "steady_wait_fraction", "batch_s", "step_mean_s", "stage_total_s", "shares",
                     "worker_busy", "worker_cpu_mean"):
            out[name] = getattr(self, name)
        return out


@dataclass
class Report:
    """The verdict of :func:`diagnose`: ``bottleneck`` (one of :data:`BOTTLENECKS`), the
    ``evidence``, ``reasons`` (the evidence that led there, short strings) and ``fix``."""

    bottleneck: str
    evidence: Evidence
    reasons: list[str] = field(default_factory=list)
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: bottleneck, fix, reasons, evidence (fields and derived figures)."""
        return {"bottleneck": self.bottleneck, "fix": self.fix, "reasons": list(self.reasons),
                "evidence": self.evidence.to_dict()}

    def __str__(self) -> str:
        ev = self.evidence
        cpu = " ".join(f"{c:.0%}" for c in ev.worker_cpu) or "-"
        lines = [f"gpufeed doctor: bottleneck = {self.bottleneck}", f"  fix: {self.fix}"]
        lines += [f"  - {r}" for r in self.reasons]
        lines.append(
            f"  run: {ev.batches} batches in {ev.wall_s:.2f} s ({ev.batch_s * 1e3:.1f} ms/batch, "
            f"step {ev.step_mean_s * 1e3:.1f} ms, wait {ev.data_wait_fraction:.0%}"
            + (f", {ev.epoch_starts} epoch starts" if ev.epoch_starts else "")
            + (f", {ev.parent_batches} made by the main process from the cache "
               f"({ev.parent_s / ev.parent_batches * 1e3:.1f} ms each)" if ev.parent_batches else "") + ")"
            + (f", replay {ev.replay_step_s * 1e3:.1f} ms/step" if ev.replay_step_s is not None else ""))
        lines.append(
            f"  cpu: workers {ev.num_workers} [{cpu} of a core], main {ev.main_cpu:.0%}, "
            f"idle {ev.idle_cores:.1f}/{ev.usable_cores:g} cores, others {ev.other_cores:.1f}, "
            f"iowait {ev.iowait_fraction:.0%}")
        if ev.worker_running is not None and ev.worker_blocked is not None:
            lines.append(f"  worker threads: running {ev.worker_running:.0%}, blocked "
                         f"{ev.worker_blocked:.0%}, D-state {ev.dstate_fraction or 0.0:.0%} "
                         f"({ev.state_samples} samples); queue {ev.queue_depth_mean:.1f}/{ev.queue_capacity}")
        if ev.stage_total_s > 0:
            stages = "  ".join(f"{k} {v:.0%}" for k, v in ev.shares.items())
            lines.append(f"  worker time {ev.stage_total_s:.2f} s: {stages}"
                         + (f"; h2d {ev.h2d_s:.2f} s" if ev.h2d_s else ""))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------- decision

def decide(ev: Evidence) -> tuple[str, list[str], str]:
    """(bottleneck, reasons, fix) from the evidence; pure, thresholds are module constants."""
    wait = ev.data_wait_fraction
    ms = 1e3
    if ev.steady_wait_fraction < WAIT_OK:
        return _compute(ev)
    reasons = [f"the step waited for data {wait:.0%} of the run "
               f"({ev.wait_s / max(ev.batches, 1) * ms:.1f} ms/batch; step {ev.step_mean_s * ms:.1f} ms)"]
    if ev.num_workers == 0:
        n = max(1, round(ev.usable_cores))
        reasons.append("num_workers=0: batches are made in the training process, between steps")
        return "workers", reasons, f"load in worker processes: num_workers={n}"
    if ev.parent_batches and ev.parent_batches * 2 >= ev.batches:
        # Whole batches of cache hits are copied into their slots by the main process (no worker
        # is involved): its copying is the data path, and worker-side fixes do not apply.
        reasons.append(f"{ev.parent_batches} of {ev.batches} batches came whole from the host cache, "
                       f"copied by the main process ({ev.parent_s / ev.parent_batches * ms:.1f} ms each)")
        return "cache", reasons, (
            "cached batches are served at memory-copy speed: keep them small on the host (uint8 "
            "output, normalize on the GPU with device=), or give each step more work")

    per_worker_s = ev.stage_total_s / ev.num_workers
    if ev.h2d_s >= TRANSFER_SHARE * ev.wall_s and ev.h2d_s >= per_worker_s:
        reasons.append(f"host-to-device copies take {ev.h2d_s / ev.wall_s:.0%} of the run "
                       f"({ev.h2d_s / ev.batches * ms:.1f} ms/batch), more than a worker's work "
                       f"({per_worker_s / ev.batches * ms:.1f} ms/batch)")
        return "transfer", reasons, (
            "send less over PCIe: keep batches uint8 on the wire (device= with normalize/dtype runs "
            "them on the GPU), a smaller crop; check the link (`nvidia-smi -q`, 'GPU Link Info')")

    # Thread states count only when both shares were sampled; otherwise CPU fractions stand in.
    if ev.worker_running is not None and ev.worker_blocked is not None and ev.state_samples > 0:
        sampled, running, blocked = True, ev.worker_running, ev.worker_blocked
    else:
        sampled = False
        running = min(1.0, ev.worker_cpu_mean)
        blocked = max(0.0, ev.worker_busy - ev.worker_cpu_mean)
    dstate = ev.dstate_fraction or 0.0
    shares = ev.shares
    read_share = shares.get("read", 0.0)
    io_signs = ev.iowait_fraction >= IOWAIT_HIGH or dstate >= DSTATE_HIGH
    cpu_txt = (f"workers use {ev.worker_cpu_mean:.0%} of a core each and ran (R) {running:.0%} "
               f"of the samples" + (f", blocked {blocked:.0%}" if sampled else ""))
    if running < CPU_BOUND and (
        (ev.image_path and read_share >= READ_SHARE)
        or io_signs
        or (not ev.image_path and blocked >= BLOCKED and ev.worker_busy >= BUSY_LOW)
    ):
        return _read(ev, reasons, cpu_txt, read_share, io_signs, dstate)

    if running >= CPU_BOUND or ev.worker_cpu_mean >= CPU_BOUND:
        reasons.append(cpu_txt + ": CPU-bound")
        if ev.idle_cores >= SPARE_CORES:
            # A worker wants a core for the share of time it is runnable (its CPU share is
            # lower when other processes compete), so that is what one more worker takes.
            demand = max(running, ev.worker_cpu_mean, 0.5)
            n = ev.num_workers + max(1, math.floor(ev.idle_cores / demand + 0.25))
            reasons.append(f"{ev.idle_cores:.1f} of {ev.usable_cores:g} cores idle: too few workers")
            return "workers", reasons, (f"raise num_workers to {n} (each worker wants a core "
                                        f"{demand:.0%} of the time)")
        idle = f"no core to spare ({ev.idle_cores:.1f} of {ev.usable_cores:g} idle"
        if ev.other_cores >= SPARE_CORES:
            idle += f"; other processes use {ev.other_cores:.1f} cores"
        reasons.append(idle + ")")
        bottleneck, reasons, fix = _cpu_stage(ev, reasons, shares)
        if ev.other_cores >= max(SPARE_CORES, ev.usable_cores / 2):
            fix = f"first, free the {ev.other_cores:.1f} cores other processes use; then {fix}"
        return bottleneck, reasons, fix

    # Neither computing nor reading: the workers are mostly idle while the step waits.
    reasons.append(f"{cpu_txt}; inside a stage only {ev.worker_busy:.0%} of the time: workers "
                   "wait for work (start-up each epoch, or the main process dispatches slowly)")
    return "workers", reasons, (
        "keep workers across epochs (persistent_workers=True) and raise prefetch_factor; "
        f"the training process uses {ev.main_cpu:.0%} of a core")


def _compute(ev: Evidence) -> tuple[str, list[str], str]:
    outside = " outside epoch starts" if ev.epoch_starts else ""
    reasons = [f"the step waited for data only {ev.steady_wait_fraction:.0%} of the run{outside} "
               f"(queue {ev.queue_depth_mean:.1f} of {ev.queue_capacity} ready)"]
    fix = "the loader keeps up: optimize the model step (mixed precision, torch.compile, fused ops)"
    epoch_share = ev.epoch_start_wait_s / ev.wall_s if ev.wall_s > 0 else 0.0
    if epoch_share >= WAIT_OK / 2:
        reasons.append(f"{ev.epoch_starts} epoch starts cost {epoch_share:.0%} of the run "
                       f"({ev.epoch_start_wait_s / ev.epoch_starts * 1e3:.0f} ms each: every "
                       "epoch starts with an empty queue)")
        fix += f"; epoch starts cost {epoch_share:.0%}: fewer, longer epochs"
    if ev.replay_step_s is None or ev.batch_s <= 0:
        return "compute", reasons, fix
    ratio = ev.replay_step_s / ev.batch_s
    replay = (f"replaying {ev.replay_batches} kept batches without the loader: "
              f"{ev.replay_step_s * 1e3:.1f} ms/step vs {ev.batch_s * 1e3:.1f} ms/batch in the run")
    if ratio >= REPLAY_SAME:
        reasons.append(replay + ": the step itself limits")
        return "compute", reasons, fix
    reasons.append(replay + f" ({1 / ratio:.1f}x faster): the loader's workers slow the step")
    fewer = max(1, ev.num_workers - 1)
    return "compute", reasons, (f"the loader keeps up but competes with the step for CPU: try "
                                f"num_workers={fewer} or pin_workers=True; then optimize the step")


def _read(ev: Evidence, reasons: list[str], cpu_txt: str, read_share: float, io_signs: bool,
          dstate: float) -> tuple[str, list[str], str]:
    reasons.append(cpu_txt + ": they wait, not compute")
    if ev.image_path:
        reasons.append(f"reading is {read_share:.0%} of worker time "
                       f"({ev.read_s / max(ev.samples, 1) * 1e3:.1f} ms/image)")
        rc = ev.read_concurrency or 1
        budget = ("" if ev.read_budget_bytes is None else
                  f", at most {format_bytes(ev.read_budget_bytes)} read and not yet decoded "
                  f"(read_budget_bytes={ev.read_budget_bytes})")
        reasons.append(f"{rc} read{'s' if rc > 1 else ''} in flight per worker "
                       f"(the dataset's read_concurrency={rc}{budget})")
        more = (f"raise the dataset's read_concurrency to {min(64, max(16, rc * 4))} "
                f"(e.g. ImageDataset(ds, read_concurrency=N) for a thread-safe dataset; "
                f"`gpufeed tune` measures 1, 4, 16, 64)")
    else:
        ft = ev.fetch_threads
        reasons.append(f"{max(ft, 1)} read{'s' if ft > 1 else ''} in flight per worker "
                       f"(the dataset's fetch_threads={ft})")
        more = (f"set fetch_threads={min(64, max(8, ft * 4))} on a thread-safe dataset "
                f"(dataset.fetch_threads = N: __getitem__ on N threads per worker)")
    io = f"iowait {ev.iowait_fraction:.0%} of CPU time, D-state {dstate:.0%} of samples"
    store = "pack the folder into one LMDB (`gpufeed pack ROOT DATA.lmdb`) or move it to local SSD"
    if io_signs:  # the disk is busy: fewer, larger reads, or faster storage
        reasons.append(io + ": the disk is the limit")
        cache = "; if it fits in RAM, cache_bytes='60%'" if not ev.cache_hit_rate else ""
        return "read", reasons, store + cache
    # Blocked without iowait or D: latency (network storage, throttling); overlap it.
    reasons.append(io + ": reads wait on latency (network storage? throttling?)")
    n = max(ev.num_workers * 2, ev.num_workers + 2)
    return "read", reasons, f"overlap the reads: {more}, or raise num_workers to {n}; or {store}"


def _cpu_stage(ev: Evidence, reasons: list[str], shares: dict[str, float]) -> tuple[str, list[str], str]:
    if not ev.image_path:
        if shares:
            reasons.append(f"dataset __getitem__ {shares['fetch']:.0%}, collate_fn "
                           f"{shares['collate']:.0%} of worker time: Python preprocessing")
        return "transform", reasons, (
            "make per-sample Python cheaper: batch it (__getitems__), move augmentation to the GPU, "
            "or use gpufeed.ImageFolder with a gpufeed transform (the image fast path)")
    decode, transform = shares.get("decode", 0.0), shares.get("transform", 0.0)
    split = f"decode {decode:.0%}, crop/resize/normalize {transform:.0%}, read {shares.get('read', 0.0):.0%}"
    if decode >= transform:
        per_image = ev.decode_s / max(ev.samples, 1) * 1e3
        stored = ev.stored_short_side_px
        size = f", stored short side ~{stored:.0f} px" if stored else ""
        reasons.append(f"{split} of worker time; decode {per_image:.1f} ms/image{size}")
        cache = ("cache_bytes keeps decoded images after the first epoch (eval transform)"
                 if ev.deterministic is not False else "more cores per GPU")
        out = ev.output_side_px or 224
        if stored is None or stored > 2 * out:  # decode cost grows with the stored pixels
            max_side = max(512, -(-2 * out // 64) * 64)
            return "decode", reasons, (
                f"lower the decode cost: store smaller images (`gpufeed pack ROOT DATA.lmdb "
                f"--max-side {max_side}`); or {cache}")
        return "decode", reasons, f"images are already small: decode is the cost; {cache}"
    reasons.append(f"{split} of worker time")
    return "transform", reasons, (
        "lower the per-image transform cost: a smaller output size, and dtype/normalize on the GPU "
        "(device=) instead of in the workers")


# ---------------------------------------------------------------------------------- running

class _Epochs:
    """Batches from ``loader`` across epochs; ``close()`` drops the current iterator."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self._it: Iterator[Any] | None = None
        self.started = 0  # iterators (epochs) started

    def next(self) -> Any:
        for _ in range(2):
            if self._it is None:
                self._it = iter(self._loader)
                self.started += 1
            try:
                return next(self._it)
            except StopIteration:
                self._it = None
        raise ValueError("the loader yielded no batches: nothing to diagnose")

    def worker_pids(self) -> list[int]:
        pids = getattr(self._loader, "worker_pids", None)
        if callable(pids):
            return list(pids())
        return [w.pid for w in getattr(self._it, "_workers", ()) if w.pid is not None]

    def close(self) -> None:
        self._it = None


def _make_step(step: Callable[[Any], Any] | None, step_ms: float | None, sync: bool) -> Callable[[Any], None]:
    if step is None:
        seconds = (step_ms or 0.0) / 1e3

        def simulated(batch: Any) -> None:
            if seconds > 0:
                time.sleep(seconds)  # a GPU-bound step: the host thread waits, cores stay free

        return simulated
    if not sync:
        return step

    def synced(batch: Any) -> None:
        step(batch)
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()  # else the step's time is the kernel launches' time

    return synced


def _loader_stats(loader: Any) -> dict[str, Any]:
    stats = getattr(loader, "stats", None)
    return dict(stats()) if callable(stats) else {}


def _evidence(loader: Any, before: dict[str, Any], after: dict[str, Any], probe: ProbeResult, *,
              batches: int, wall_s: float, wait_s: float, step_s: float, samples: int,
              replay: tuple[int, float | None], image_info: dict[str, Any],
              epochs: tuple[int, float]) -> Evidence:
    def delta(key: str) -> float:
        return float(after.get(key, 0) or 0) - float(before.get(key, 0) or 0)

    waits = delta("waits")
    depth = ((after.get("queue_depth_mean", 0.0) * after.get("waits", 0)
              - before.get("queue_depth_mean", 0.0) * before.get("waits", 0)) / waits) if waits > 0 else 0.0
    lookups = delta("cache_hits") + delta("cache_misses")
    num_workers = int(getattr(loader, "num_workers", 0) or 0)
    prefetch = getattr(loader, "prefetch_factor", None) or 0
    wall = probe.wall_s if probe.wall_s > 0 else wall_s
    idle = (probe.system_idle_s + probe.system_iowait_s) / wall
    if probe.cgroup_spare_s is not None:
        idle = min(idle, probe.cgroup_spare_s / wall)
    total_sys = probe.system_busy_s + probe.system_idle_s + probe.system_iowait_s
    n_states = probe.state_samples
    # Any: Evidence's fields differ in type, so a dict[str, float] could not be spread into it.
    stage_s: dict[str, Any] = {k: max(0.0, delta(k)) for k in STAGES}
    return Evidence(
        batches=batches, wall_s=wall_s, wait_s=wait_s, step_s=step_s, num_workers=num_workers,
        usable_cores=probe.usable_cores, image_path="images" in after,
        samples=int(delta("samples")) or samples,
        **stage_s,
        queue_depth_mean=max(0.0, depth), queue_capacity=prefetch * num_workers,
        worker_cpu=_per_worker(probe.worker_cpu_s, probe.worker_ids, wall),
        main_cpu=probe.main_cpu_s / wall,
        idle_cores=idle,
        other_cores=max(0.0, (probe.system_busy_s - probe.tree_cpu_s) / wall),
        iowait_fraction=probe.system_iowait_s / total_sys if total_sys > 0 else 0.0,
        worker_running=probe.running_samples / n_states if n_states else None,
        worker_blocked=probe.blocked_samples / n_states if n_states else None,
        dstate_fraction=probe.dstate_samples / n_states if n_states else None,
        state_samples=n_states,
        replay_batches=replay[0], replay_step_s=replay[1],
        cache_hit_rate=delta("cache_hits") / lookups if lookups > 0 else None,
        parent_batches=int(delta("parent_batches")), parent_s=max(0.0, delta("parent_s")),
        epoch_starts=epochs[0], epoch_start_wait_s=epochs[1],
        fetch_threads=_int_attr(getattr(loader, "dataset", None), "fetch_threads"),
        **image_info,
    )


def _int_attr(obj: Any, name: str) -> int:
    value = getattr(obj, name, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _image_info(loader: Any, k: int = 16) -> dict[str, Any]:
    """Stored sizes of ``k`` images spread over an image source, and the transform's output."""
    dataset = getattr(loader, "dataset", None)
    transform = getattr(dataset, "transform", None)
    read = getattr(dataset, "read", None)
    if (dataset is None or transform is None or not callable(read)
            or not hasattr(transform, "output_size")):
        return {}
    from gpufeed.decode import read_header
    from gpufeed.errors import DecodeError

    n = len(dataset)
    sides = []
    for index in sorted({i * n // k for i in range(k)}) if n else ():
        try:
            header = read_header(read(index))
        except (OSError, DecodeError):
            continue  # a bad or missing file is the loader's business, not the doctor's
        sides.append(min(header.height, header.width))
    return {
        "stored_short_side_px": sum(sides) / len(sides) if sides else None,
        "output_side_px": int(max(transform.output_size)),
        "deterministic": bool(getattr(transform, "deterministic", False)),
        "read_concurrency": int(getattr(dataset, "read_concurrency", 1) or 1),
        "read_budget_bytes": _int_attr(dataset, "read_budget_bytes") or None,
    }


def _batch_len(batch: Any) -> int:
    first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    shape = getattr(first, "shape", None)
    return int(shape[0]) if shape else 0


def diagnose(
    loader: Any,
    step: Callable[[Any], Any] | None = None,
    batches: int = 200,
    *,
    step_ms: float | None = None,
    warmup_batches: int | None = None,
    replay_batches: int = 8,
    sync: bool = True,
    sample_interval_s: float = 0.025,
) -> Report:
    """Run ``loader`` for ``batches`` batches through ``step`` and say what limits the loop.

    ``step(batch)`` is your training step. Without one, a simulated step *sleeps* ``step_ms``
    milliseconds per batch (default 0: the loader runs flat out). Sleeping, not busy-waiting:
    a GPU training step keeps the GPU busy while the host thread mostly waits, so its cores stay
    free for the workers; a busy-wait would take a core from them and model a CPU-bound step.
    With ``sync`` and CUDA initialized, each step ends with ``torch.cuda.synchronize()`` so its
    time is the GPU's, not the kernel launches'.

    ``warmup_batches`` run first, uncounted (default ``prefetch_factor x num_workers + 1``: the
    queue filled at start-up is drained, and your step compiles/tunes). The first
    ``replay_batches`` measured batches are kept (they hold loader memory until the end) and the
    step is run on them again without the loader (skipped with a simulated step of 0 ms).
    Epochs roll over as needed; with ``persistent_workers=False`` every epoch's worker start-up
    counts, as in training. Thread states are sampled every ``sample_interval_s`` seconds.

    Works best with a :class:`gpufeed.FastLoader` (stage timings); a torch ``DataLoader`` gets
    the process-level part of the diagnosis.
    """
    for name, value, low in (("batches", batches, 1), ("replay_batches", replay_batches, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"`{name}` must be an int >= {low}. Found: {shorten(value)}.")
    if step is not None and step_ms is not None:
        raise ValueError("pass either `step` (your training step) or `step_ms` (a simulated step), not both.")
    if step_ms is not None and not step_ms >= 0:
        raise ValueError(f"`step_ms` must be >= 0 milliseconds. Found: {shorten(step_ms)}.")
    if warmup_batches is None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        warmup_batches = (getattr(loader, "prefetch_factor", None) or 0) * workers + 1
    elif isinstance(warmup_batches, bool) or not isinstance(warmup_batches, int) or warmup_batches < 0:
        raise ValueError(f"`warmup_batches` must be an int >= 0. Found: {shorten(warmup_batches)}.")
    run_step = _make_step(step, step_ms, sync)
    if step is None and not step_ms:
        replay_batches = 0  # nothing to replay: the simulated step does nothing
    image_info = _image_info(loader)
    probe = TreeProbe(interval_s=sample_interval_s)
    feed = _Epochs(loader)
    kept: list[Any] = []
    wait_s = step_s = epoch_wait_s = 0.0
    samples = epoch_starts = 0
    try:
        for _ in range(warmup_batches):
            run_step(feed.next())
        before = _loader_stats(loader)
        probe.set_workers(feed.worker_pids())
        probe.start()
        try:
            t_start = time.perf_counter()
            for _ in range(batches):
                started = feed.started
                t0 = time.perf_counter()
                batch = feed.next()
                t1 = time.perf_counter()
                run_step(batch)
                t2 = time.perf_counter()
                if feed.started > started:
                    epoch_starts += 1
                    epoch_wait_s += t1 - t0
                wait_s += t1 - t0
                step_s += t2 - t1
                samples += _batch_len(batch)
                if len(kept) < replay_batches:
                    kept.append(batch)
                del batch
                probe.set_workers(feed.worker_pids())
            wall_s = time.perf_counter() - t_start
        finally:
            measured = probe.stop()
        after = _loader_stats(loader)
    finally:
        feed.close()
    replay: tuple[int, float | None] = (0, None)
    if kept:
        t0 = time.perf_counter()
        for batch in kept:
            run_step(batch)
        replay = (len(kept), (time.perf_counter() - t0) / len(kept))
        kept.clear()
    ev = _evidence(loader, before, after, measured, batches=batches, wall_s=wall_s, wait_s=wait_s,
                   step_s=step_s, samples=samples, replay=replay, image_info=image_info,
                   epochs=(epoch_starts, epoch_wait_s))
    bottleneck, reasons, fix = decide(ev)
    return Report(bottleneck, ev, reasons, fix)


def _per_worker(cpu_s: dict[int, float], worker_ids: dict[int, int], wall_s: float) -> tuple[float, ...]:
    """One CPU figure (fraction of a core) per worker id: the pids that held the id (replaced
    workers, each iterator's workers when they are not persistent) summed."""
    by_id: dict[int, float] = {}
    for pid, cpu in cpu_s.items():
        worker_id = worker_ids.get(pid, pid)
        by_id[worker_id] = by_id.get(worker_id, 0.0) + cpu
    return tuple(by_id[i] / wall_s for i in sorted(by_id))
