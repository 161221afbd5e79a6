"""pin_workers pins worker k to one CPU; log_dir gives each worker its own log file."""

from __future__ import annotations

import logging
import os

import psutil
import pytest
import torch
from torch.utils.data import Dataset

from gpufeed import FastLoader

pytestmark = pytest.mark.timeout(60)


class Logs(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        logging.getLogger("user.dataset").info("loading sample %d", i)
        return torch.tensor(i)


def test_pin_workers_gives_each_worker_one_cpu_round_robin():
    cpus = sorted(os.sched_getaffinity(0))
    loader = FastLoader(Logs(), batch_size=2, num_workers=2, pin_workers=True, persistent_workers=True)
    it = iter(loader)
    next(it), next(it)  # batches 0 and 1 come from workers 0 and 1: both are set up
    affinities = [psutil.Process(pid).cpu_affinity() for pid in it.worker_pids]
    assert affinities == [[cpus[k % len(cpus)]] for k in range(2)]
    assert sorted(os.sched_getaffinity(0)) == cpus  # the main process is untouched
    loader.close()


def test_log_dir_collects_each_workers_records(tmp_path):
    loader = FastLoader(Logs(), batch_size=2, num_workers=2, log_dir=tmp_path / "logs")
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    files = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert files == ["worker-0.log", "worker-1.log"]
    text0 = (tmp_path / "logs" / "worker-0.log").read_text()
    text1 = (tmp_path / "logs" / "worker-1.log").read_text()
    # round-robin dispatch: worker 0 loads batches 0 and 2, worker 1 batches 1 and 3
    assert "loading sample 0" in text0 and "loading sample 4" in text0 and "worker 0" in text0
    assert "loading sample 2" in text1 and "loading sample 6" in text1 and "loading sample 0" not in text1
