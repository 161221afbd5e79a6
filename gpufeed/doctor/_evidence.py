"""What the doctor measures over its window: :class:`Evidence`, the input of the verdict
(``gpufeed.doctor._verdict.decide``); ``gpufeed.doctor._doctor.diagnose`` gathers it."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
    per_sample: bool = False  # ... in its per-sample form (detection/segmentation datasets)
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
    prefetch_factor: int = 0  # tasks each worker holds (its reads run ahead only within them)
    batch_size: int = 0  # the loader's (0: none, or unknown)
    reads: int = 0  # image path: reads of the source by the workers
    read_latency_s: float = 0.0  # their summed duration, each timed on the thread that read
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
    read_auto: bool = False  # image sources: read_concurrency=None (workers read ahead once stalled)
    read_concurrency_max: int = 0  # image path: most reads in flight a worker allowed (stats())
    read_budget_bytes: int | None = None  # image sources: bytes read and not decoded, per worker
    fetch_threads: int = 0  # generic path: the dataset's fetch_threads (0: one sample at a time)
    local_ranks: int = 1  # ranks of this job on this host, this one included
    host_workers: int = 0  # gpufeed workers of those ranks, this one's num_workers included

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
    def read_latency_mean_s(self) -> float | None:
        """Mean duration of one read of the source (storage latency; None: no reads timed)."""
        return self.read_latency_s / self.reads if self.reads else None

    @property
    def batch_samples(self) -> float:
        """Samples per batch: the loader's batch size, else the run's mean."""
        return float(self.batch_size) if self.batch_size > 0 else self.samples / max(self.batches, 1)

    @property
    def decode_per_batch_s(self) -> float | None:
        """A worker's stage seconds per batch, reads left out: decode, transform, collate, pack
        (image path; None: no samples made by workers)."""
        made = self.samples * (self.batches - self.parent_batches) / max(self.batches, 1)
        if not self.image_path or made <= 0:
            return None  # (the main process's batches, all cache hits, have no stage seconds)
        return max(0.0, self.stage_total_s - self.read_s) / made * self.batch_samples

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
                     "worker_busy", "worker_cpu_mean", "read_latency_mean_s", "decode_per_batch_s"):
            out[name] = getattr(self, name)
        return out
