"""Local ranks on one host, run under torchrun (CPU ranks, gloo) by tests/integration/test_local_ranks.py.

    torchrun --nproc_per_node N _ranks_script.py [--tune IMAGE_ROOT] [--doctor]

Every rank first restricts itself to the first two CPUs it may use (the tests' "2-CPU host"),
then, one phase after the other (each phase its own job for the ranks' records, through
``TORCHELASTIC_RUN_ID``):

* ``split``: a pinned loader with one worker; the worker's CPU set is read with
  ``os.sched_getaffinity`` inside ``__getitem__``;
* ``own`` (2 ranks): rank 0 narrows itself to the second CPU, rank 1 keeps both; the same loader;
* ``--tune``: ``gpufeed tune IMAGE_ROOT`` on every rank at once (its output);
* ``--doctor``: 4 workers per rank, ``gpufeed.doctor.diagnose`` on every rank at once.

Rank 0 prints ``RESULT {...}``: per phase, every rank's answer in rank order.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os

import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from gpufeed import FastLoader
from gpufeed.cli import main as gpufeed_main
from gpufeed.doctor import diagnose

RUN_ID = os.environ.get("TORCHELASTIC_RUN_ID", "none")


class WorkerCpus(Dataset):
    """Sample i: the CPU set of the process that makes it, as a bit mask."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(sum(1 << cpu for cpu in os.sched_getaffinity(0)))


class Cheap(Dataset):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((16,), float(index))


def phase(name: str) -> None:
    """Start phase ``name``: a job of its own for the ranks' records."""
    os.environ["TORCHELASTIC_RUN_ID"] = f"{RUN_ID}-{name}"


def worker_cpus() -> list[int]:
    """The CPUs the pinned worker of a one-worker loader ran on."""
    with FastLoader(WorkerCpus(), batch_size=2, num_workers=1, pin_workers=True) as loader:
        masks = {int(m) for batch in loader for m in batch}
    return sorted(cpu for mask in masks for cpu in range(mask.bit_length()) if mask >> cpu & 1)


def run_tune(root: str) -> dict[str, object]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = gpufeed_main(["tune", root, "--batch-size", "4", "--batches", "2", "--warmup", "1",
                             "--no-progress", "--json", os.path.join(root, f"tune-{dist.get_rank()}.json")])
    assert code == 0, out.getvalue()
    with open(os.path.join(root, f"tune-{dist.get_rank()}.json"), encoding="utf-8") as f:
        recommended = json.load(f)["recommended_num_workers"]
    return {"text": out.getvalue(), "num_workers": recommended}


def run_doctor() -> dict[str, object]:
    loader = FastLoader(Cheap(), batch_size=4, num_workers=4, persistent_workers=True)
    next(iter(loader))  # every rank's workers run before any rank measures
    dist.barrier()
    report = diagnose(loader, batches=12, replay_batches=0)
    dist.barrier()  # the others' workers stay while any rank is measuring
    loader.close()
    return {"bottleneck": report.bottleneck, "fix": report.fix, "reasons": report.reasons,
            "local_ranks": report.evidence.local_ranks, "host_workers": report.evidence.host_workers}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tune", metavar="IMAGE_ROOT")
    parser.add_argument("--doctor", action="store_true")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    answers: dict[str, object] = {"cpus": cpus}
    phase("split")
    answers["split"] = worker_cpus()
    if world == 2:
        phase("own")
        if rank == 0:
            os.sched_setaffinity(0, cpus[1:])
        answers["own"] = worker_cpus()
        os.sched_setaffinity(0, cpus)
    if args.tune:
        phase("tune")
        answers["tune"] = run_tune(args.tune)
    if args.doctor:
        phase("doctor")
        answers["doctor"] = run_doctor()
    gathered: list[dict[str, object]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, answers)
    if rank == 0:
        print("RESULT " + json.dumps({key: [g[key] for g in gathered] for key in answers}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
