"""The doctor's decision: which stage limits a run, from its
:class:`gpufeed.doctor._evidence.Evidence` (a pure function; the thresholds are the constants
below). ``gpufeed.doctor`` gathers the evidence and re-exports :func:`decide` and
:data:`BOTTLENECKS`."""

from __future__ import annotations

import math

from gpufeed._engine.ranks import fitting_workers
from gpufeed._observe.memory import format_bytes
from gpufeed._observe.rules import reads_ahead
from gpufeed.doctor._evidence import Evidence

# What a verdict can name (gpufeed.doctor.Report.bottleneck).
BOTTLENECKS = ("read", "decode", "transform", "workers", "transfer", "compute", "cache", "host")

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


def decide(ev: Evidence) -> tuple[str, list[str], str]:
    """(bottleneck, reasons, fix) from the evidence; pure, thresholds are module constants."""
    wait = ev.data_wait_fraction
    ms = 1e3
    oversubscribed = _host(ev)
    if oversubscribed is not None:
        return oversubscribed
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


def _host(ev: Evidence) -> tuple[str, list[str], str] | None:
    """"host" when several local ranks' workers and main processes exceed the usable cores and
    this rank runs more workers than fit; else None."""
    w = ev.local_ranks
    fit = fitting_workers(ev.usable_cores, w)
    if w < 2 or ev.host_workers + w <= ev.usable_cores or ev.num_workers <= fit:
        return None
    reasons = [f"{w} local ranks run {ev.host_workers} gpufeed workers and {w} main processes on "
               f"{ev.usable_cores:g} usable cores: the host is oversubscribed "
               f"({(ev.host_workers + w) / ev.usable_cores:.1f} processes per core)",
               f"this rank runs num_workers={ev.num_workers}; " + _fit_text(fit, w, ev.usable_cores)]
    return "host", reasons, (f"num_workers={fit} per rank for {w} local ranks (or fewer ranks "
                             f"per host); `gpufeed tune` under torchrun measures it")


def _fit_text(fit: int, ranks: int, cores: float) -> str:
    if ranks * (fit + 1) <= cores:
        return f"{fit} per rank fit ({ranks} x ({fit} + 1) <= {cores:g})"
    return (f"even 1 per rank is more than the host holds ({ranks} x (1 + 1) > {cores:g}): 1 per "
            "rank is the least")


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
        if ev.read_auto:
            chose = (f"up to {ev.read_concurrency_max} so far" if ev.read_concurrency_max
                     else "not measured")
            reasons.append(f"reads in flight per worker chosen by each worker, {chose} (the "
                           f"dataset's read_concurrency=None, auto: 1 until reads take half the "
                           f"decode time, then 2-64 from the measured latency{budget})")
        else:
            reasons.append(f"{rc} read{'s' if rc > 1 else ''} in flight per worker "
                           f"(the dataset's read_concurrency={rc}{budget})")
        ahead = _reads_ahead(ev, rc)
        rc_to = ahead.read_concurrency if ahead else min(64, max(16, rc * 4))
        more = "" if rc_to <= rc else (
            f"raise the dataset's read_concurrency to {rc_to} "
            f"(e.g. ImageDataset(ds, read_concurrency=N) for a thread-safe dataset; "
            f"`gpufeed tune` measures 1, 4, 16, 64)")
        if ahead:
            reasons.append(ahead.reason)
            if ahead.prefetch_factor > (ev.prefetch_factor or 0):
                more = f"{more}; and " if more else ""
                more += (f"raise prefetch_factor to {ahead.prefetch_factor} (now "
                         f"{ev.prefetch_factor}: reads run ahead only within the tasks a "
                         f"worker holds)")
            more = more or "more reads ahead cannot help"
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


class _Ahead:
    """What covering the read latency takes (reads in flight per worker, tasks held), and why."""

    def __init__(self, read_concurrency: int, prefetch_factor: int, reason: str) -> None:
        self.read_concurrency, self.prefetch_factor, self.reason = read_concurrency, prefetch_factor, reason


def _reads_ahead(ev: Evidence, rc: int) -> _Ahead | None:
    """:func:`gpufeed._observe.rules.reads_ahead` on the measured read latency and decode
    time; None when the evidence has no timed reads (a DataLoader, or every sample a cache hit)."""
    latency, per_batch = ev.read_latency_mean_s, ev.decode_per_batch_s
    if latency is None or not per_batch:
        return None
    batch = ev.batch_samples
    rule = reads_ahead(latency, per_batch / batch, batch, rc)
    pf = ev.prefetch_factor or 0
    ms = 1e3
    reason = (f"a read takes {latency * ms:.0f} ms and a worker decodes a batch in "
              f"{per_batch * ms:.0f} ms: about {rule.needed} reads in flight per worker keep it busy")
    if rule.prefetch_factor > pf:
        held = pf - 1
        reason += (f"; at prefetch_factor={pf} a worker holds {held} task{'s' if held != 1 else ''}"
                   f" ({held * batch:.0f} reads) ahead, whose reads begin only "
                   f"{held * per_batch * ms:.0f} ms before they are needed")
    return _Ahead(rule.read_concurrency, max(pf, rule.prefetch_factor), reason)


def _per_sample_stage(reasons: list[str], shares: dict[str, float]) -> tuple[str, list[str], str]:
    """The CPU-bound verdict of a detection/segmentation loader (the per-sample path), whose
    images keep their annotations: no advice to store them smaller or cache them decoded."""
    decode, transform = shares.get("decode", 0.0), shares.get("transform", 0.0)
    reasons.append(f"decode {decode:.0%}, target, joint ops and collate_fn {transform:.0%}, read "
                   f"{shares.get('read', 0.0):.0%} of worker time")
    if decode >= transform:
        return "decode", reasons, (
            "decode is the cost (a baseline JPEG already decodes only down to the last row the ops "
            "read): more CPU cores per GPU, or progressive JPEGs re-encoded as baseline ones")
    return "transform", reasons, (
        "lower the per-sample op cost: ops that run as given (gpufeed.explain(loader) lists them) "
        "cost more than translated ones, and a uint8 output, with ToDtype/Normalize on the GPU "
        "after the batch arrives, saves the float conversion in the workers")


def _cpu_stage(ev: Evidence, reasons: list[str], shares: dict[str, float]) -> tuple[str, list[str], str]:
    if not ev.image_path:
        if shares:
            reasons.append(f"dataset __getitem__ {shares['fetch']:.0%}, collate_fn "
                           f"{shares['collate']:.0%} of worker time: Python preprocessing")
        return "transform", reasons, (
            "make per-sample Python cheaper: batch it (__getitems__), move augmentation to the GPU, "
            "or use gpufeed.ImageFolder with a gpufeed transform (the image fast path)")
    decode, transform = shares.get("decode", 0.0), shares.get("transform", 0.0)
    if ev.per_sample:
        return _per_sample_stage(reasons, shares)
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
