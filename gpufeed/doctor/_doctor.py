"""Why is the GPU waiting? ``diagnose(loader, step)`` names what limits a training loop (the code;
documented in ``gpufeed.doctor``, which re-exports it)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from gpufeed._fastpath.subsets import fast_dataset
from gpufeed._progress import ProgressBar
from gpufeed.cuda._sync import wait_for_device
from gpufeed.decoders import read_header
from gpufeed.doctor._evidence import Evidence
from gpufeed.doctor._host_load import HostLoad
from gpufeed.doctor._probe import ProbeResult, TreeProbe
from gpufeed.doctor._verdict import BOTTLENECKS, decide
from gpufeed.errors import DecodeError, check_int, is_int, shorten
from gpufeed.sources import DetectionSource
from gpufeed.stats import STAGES

__all__ = ["BOTTLENECKS", "Evidence", "Report", "decide", "diagnose"]



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
            f"iowait {ev.iowait_fraction:.0%}"
            + (f"; host: {ev.local_ranks} local ranks, {ev.host_workers} workers" if ev.local_ranks > 1 else ""))
        if ev.worker_running is not None and ev.worker_blocked is not None:
            lines.append(f"  worker threads: running {ev.worker_running:.0%}, blocked "
                         f"{ev.worker_blocked:.0%}, D-state {ev.dstate_fraction or 0.0:.0%} "
                         f"({ev.state_samples} samples); queue {ev.queue_depth_mean:.1f}/{ev.queue_capacity}")
        if ev.stage_total_s > 0:
            stages = "  ".join(f"{k} {v:.0%}" for k, v in ev.shares.items())
            lines.append(f"  worker time {ev.stage_total_s:.2f} s: {stages}"
                         + (f"; h2d {ev.h2d_s:.2f} s" if ev.h2d_s else ""))
        return "\n".join(lines)


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
        wait_for_device()  # else the step's time is the kernel launches' time

    return synced


def _loader_stats(loader: Any) -> dict[str, Any]:
    stats = getattr(loader, "stats", None)
    return dict(stats()) if callable(stats) else {}


def _evidence(loader: Any, before: dict[str, Any], after: dict[str, Any], probe: ProbeResult, *,
              batches: int, wall_s: float, wait_s: float, step_s: float, samples: int,
              replay: tuple[int, float | None], image_info: dict[str, Any],
              epochs: tuple[int, float], host: HostLoad | None = None) -> Evidence:
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
        prefetch_factor=int(prefetch), batch_size=_int_attr(loader, "batch_size"),
        reads=int(delta("reads")),
        read_latency_s=max(0.0, delta("read_latency_s")),
        read_concurrency_max=int(after.get("read_concurrency_max", 0) or 0),
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
        local_ranks=1 if host is None else host.ranks,
        host_workers=num_workers + (0 if host is None else host.other_workers),
        **image_info,
    )


def _int_attr(obj: Any, name: str) -> int:
    value = getattr(obj, name, 0)
    return value if is_int(value) else 0


def _image_info(loader: Any, k: int = 16) -> dict[str, Any]:
    """Stored sizes of ``k`` images spread over an image source, and the transform's output;
    for a detection/segmentation source (the per-sample path), that it is one."""
    dataset = getattr(loader, "dataset", None)
    if dataset is not None and isinstance(fast_dataset(dataset), DetectionSource):
        return {"per_sample": True}
    transform = getattr(dataset, "transform", None)
    read = getattr(dataset, "read", None)
    if (dataset is None or transform is None or not callable(read)
            or not hasattr(transform, "output_size")):
        return {}
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
        "read_auto": getattr(dataset, "read_auto", False) is True,
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
    progress: bool = False,
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
    the process-level part of the diagnosis. ``progress``: a bar over the batches on stderr
    when it is a terminal.
    """
    for name, value, low in (("batches", batches, 1), ("replay_batches", replay_batches, 0)):
        check_int(name, value, low)
    if step is not None and step_ms is not None:
        raise ValueError("pass either `step` (your training step) or `step_ms` (a simulated step), not both.")
    if step_ms is not None and not step_ms >= 0:
        raise ValueError(f"`step_ms` must be >= 0 milliseconds. Found: {shorten(step_ms)}.")
    if warmup_batches is None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        warmup_batches = (getattr(loader, "prefetch_factor", None) or 0) * workers + 1
    else:
        check_int("warmup_batches", warmup_batches, 0)
    run_step = _make_step(step, step_ms, sync)
    if step is None and not step_ms:
        replay_batches = 0  # nothing to replay: the simulated step does nothing
    image_info = _image_info(loader)
    probe = TreeProbe(interval_s=sample_interval_s)
    host = HostLoad(loader)  # the other local ranks' workers, counted at both ends of the window
    feed = _Epochs(loader)
    bar = ProgressBar(warmup_batches + batches, progress, "gpufeed doctor", unit="batch")
    kept: list[Any] = []
    wait_s = step_s = epoch_wait_s = 0.0
    samples = epoch_starts = 0
    try:
        for _ in range(warmup_batches):
            run_step(feed.next())
            bar.done()
        before = _loader_stats(loader)
        host.read()
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
                bar.done()
            wall_s = time.perf_counter() - t_start
        finally:
            measured = probe.stop()
        after = _loader_stats(loader)
        host.read()
    finally:
        bar.close()
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
                   epochs=(epoch_starts, epoch_wait_s), host=host)
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
