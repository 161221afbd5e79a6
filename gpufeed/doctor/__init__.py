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
  - ``"host"``: several local ranks share the host and their workers plus their main
    processes exceed its usable cores (the other ranks' workers are counted from ``/proc``):
    the fix is the per-rank ``num_workers`` that fits;
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

from gpufeed.doctor._doctor import (
    BOTTLENECKS,
    Evidence,
    Report,
    decide,
    diagnose,
)

__all__ = [
    "BOTTLENECKS",
    "Evidence",
    "Report",
    "decide",
    "diagnose",
]
