"""gpufeed.DistributedSampler under torchrun: 2 CPU ranks (gloo), a FastLoader with a worker each."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrent import result as run_result

SCRIPT = Path(__file__).with_name("_ddp_sampler_script.py")
REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(nproc: int) -> subprocess.CompletedProcess[str]:
    # The ranks import this tree's gpufeed, whatever copy is installed.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    for _ in range(3):  # another process may take the free port between our check and torchrun's bind
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(SCRIPT)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=100, env=env)
        if out.returncode == 0 or "address already in use" not in out.stderr.lower():
            return out
    return out


def _run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    return _torchrun(2)


SIDE_BY_SIDE = {"ddp-sampler": (5.2, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_two_ranks_train_equal_counts_and_eval_exactly_once(side_by_side):
    out = run_result(side_by_side, "ddp-sampler")
    assert out.returncode == 0, out.stderr[-4000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(line.removeprefix("RESULT "))
    assert report["world_size"] == 2
    n = report["num_samples"]
    orders = {}
    for mode, epoch in itertools.product(("train", "eval"), (0, 1)):
        ranks = report[f"{mode}/{epoch}"]
        seen = [r["seen"] for r in ranks]
        assert [len(s) for s in seen] == [r["len"] for r in ranks]
        assert ranks[0]["order"] == ranks[1]["order"]  # one global order, whatever the rank
        order = orders.setdefault(epoch, ranks[0]["order"])
        assert order == ranks[0]["order"] and sorted(order) == list(range(n))  # same for both modes
        if mode == "train":  # same count on each rank; everything seen; only the pad repeats
            assert len(seen[0]) == len(seen[1]) == (n + 1) // 2
            assert set(seen[0]) | set(seen[1]) == set(range(n))
        else:  # disjoint and complete, no duplicates
            assert sorted(seen[0] + seen[1]) == list(range(n))
            assert [len(s) for s in seen] == [(n + 1) // 2, n // 2]
        interleaved = [i for step in itertools.zip_longest(*seen) for i in step if i is not None]
        assert interleaved[:n] == order  # rank r takes positions r, r + 2, ... of the global order
    assert orders[0] != orders[1]  # set_epoch reached the sampler
