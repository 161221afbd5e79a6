"""Local ranks on one host: how a loader learns its place (option, environment), the rule that
splits CPUs among the ranks that share them, the ranks' records, and per-rank tuning."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from gpufeed import FastLoader
from gpufeed._engine.host import HostRanks, RankRecord, pin_share, workers_of
from gpufeed._engine.ranks import LocalRanks, cpu_share, cpu_shares, find_local_ranks, fitting_workers
from gpufeed.tune import tune

from .test_tune import CostModel, GiB

pytestmark = pytest.mark.timeout(60)


def test_ranks_sharing_one_set_take_contiguous_disjoint_slices():
    assert cpu_shares({0: {0, 1}, 1: {0, 1}}) == {0: (0,), 1: (1,)}
    assert cpu_shares({r: range(8) for r in range(3)}) == {0: (0, 1), 1: (2, 3, 4), 2: (5, 6, 7)}
    eight = cpu_shares({r: range(96) for r in range(8)})
    assert eight[3] == tuple(range(36, 48)) and sum(len(s) for s in eight.values()) == 96


def test_more_ranks_than_cpus_put_as_few_ranks_as_can_be_on_each_cpu():
    assert cpu_shares({r: {0, 1} for r in range(4)}) == {0: (0,), 1: (1,), 2: (0,), 3: (1,)}
    assert cpu_shares({r: {5} for r in range(3)}) == {0: (5,), 1: (5,), 2: (5,)}


def test_numa_bound_ranks_split_only_their_node():
    nodes = {r: range(48) if r < 4 else range(48, 96) for r in range(8)}
    shares = cpu_shares(nodes)
    assert shares[0] == tuple(range(12)) and shares[4] == tuple(range(48, 60))
    assert shares[7] == tuple(range(84, 96))


def test_a_rank_on_part_of_another_ranks_set_keeps_its_own_cpu():
    # rank 0 narrowed itself to CPU 1; rank 1, on both, takes CPU 0 and leaves CPU 1 to rank 0
    assert cpu_shares({0: {1}, 1: {0, 1}}) == {0: (1,), 1: (0,)}
    assert cpu_share({0: {0, 1}, 1: {1}}, 0) == (0,) and cpu_share({0: {1}}, 1) == ()


def test_local_ranks_come_from_the_option_then_the_environment():
    env = {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert find_local_ranks((2, 3), env) == LocalRanks(2, 3, "local_ranks=")
    assert find_local_ranks(None, env) == LocalRanks(1, 4, "LOCAL_RANK/LOCAL_WORLD_SIZE")
    # LOCAL_RANK alone, no process group (none is initialised here): nothing says how many
    assert find_local_ranks(None, {"LOCAL_RANK": "1"}) is None
    assert find_local_ranks(None, {}) is None and find_local_ranks(None, {"LOCAL_RANK": "x"}) is None


@pytest.mark.parametrize("bad", [(2, 2), (-1, 2), (0, 0), (1,), "0,2", (True, 2), (0.0, 2)])
def test_local_ranks_option_is_checked_at_construction(bad):
    with pytest.raises(ValueError, match=r"`local_ranks` must be None or \(local rank, number"):
        FastLoader(list(range(4)), local_ranks=bad)


def test_local_ranks_is_a_public_attribute_that_rebuilds():
    loader = FastLoader(list(range(4)), batch_size=2, local_ranks=(1, 2))
    assert loader.local_ranks == (1, 2) and loader.replace(batch_size=1).local_ranks == (1, 2)


def test_fitting_workers_leave_a_core_per_main_process():
    assert fitting_workers(96, 8) == 11 and fitting_workers(2, 2) == 1 and fitting_workers(2.5, 1) == 2
    assert fitting_workers(4, 8) == 1  # at least one


def _parent_record(rank: int, count: int) -> RankRecord:
    parent = psutil.Process(os.getppid())
    return RankRecord(rank, count, parent.pid, parent.create_time(), tuple(sorted(os.sched_getaffinity(0))))


def _write(directory, job: str, record: RankRecord) -> None:
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, f"{job}-{record.local_rank}.json"), "w", encoding="utf-8") as f:
        json.dump({"local_rank": record.local_rank, "count": record.count, "pid": record.pid,
                   "started": record.started, "cpus": list(record.cpus)}, f)


def test_records_of_ended_processes_are_ignored_and_removed(tmp_path):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
    host = HostRanks(LocalRanks(0, 3, "local_ranks="), str(tmp_path), env)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    _write(tmp_path, host.job, RankRecord(2, 3, int(ended.stdout), 1.0, (0,)))
    _write(tmp_path, host.job, _parent_record(1, 3))
    _write(tmp_path, "otherjob0000", _parent_record(1, 3))  # another job's rank 1
    mine = host.publish()
    assert mine.pid == os.getpid() and mine.cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert sorted(host.records()) == [0, 1]  # rank 2's process ended
    assert sorted(os.listdir(tmp_path)) == sorted([f"{host.job}-0.json", f"{host.job}-1.json",
                                                   "otherjob0000-1.json"])
    assert sorted(host.wait(0.05)) == [0, 1]  # rank 2 never comes: what there is after the wait


def test_pin_share_splits_with_the_recorded_ranks_and_says_how(tmp_path, monkeypatch):
    own = tuple(sorted(os.sched_getaffinity(0)))
    alone = pin_share(None, environ={})
    assert alone.cpus == own and "no local rank known" in alone.how and "as if it were alone" in alone.how
    assert not alone.guess and pin_share(None, environ={"LOCAL_RANK": "1"}).guess  # one of several?
    if len(own) < 2:
        pytest.skip("needs 2 CPUs to split")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("MASTER_PORT", "4321")
    local = LocalRanks(0, 2, "local_ranks=")
    _write(tmp_path, HostRanks(local, str(tmp_path)).job, _parent_record(1, 2))
    placed = pin_share(local, wait_s=5, directory=str(tmp_path))
    assert placed.cpus == own[:len(own) // 2] and "local rank 0 of 2 (local_ranks=)" in placed.how
    assert not placed.guess
    placed = pin_share(LocalRanks(1, 3, "local_ranks="), wait_s=0.05, directory=str(tmp_path))
    assert placed.cpus == cpu_share({r: own for r in range(3)}, 1) and placed.guess
    assert "local ranks [2] recorded no CPUs within 0.05 s" in placed.how


@pytest.mark.timeout(120)
def test_workers_name_themselves_and_are_counted_under_their_rank():
    loader = FastLoader(list(range(8)), batch_size=2, num_workers=2, persistent_workers=True)
    with loader:
        for _ in loader:  # a whole epoch: each worker has made a batch, so has named itself
            pass
        names = {psutil.Process(pid).name() for pid in loader.worker_pids()}
        assert names == {"gpufeed-w0", "gpufeed-w1"} and workers_of(os.getpid()) == 2
    assert workers_of(os.getpid()) == 0


def test_tune_for_local_ranks_recommends_per_rank_within_the_host(monkeypatch):
    monkeypatch.setattr("gpufeed.tune._tune.usable_cores", lambda: 8)
    model = CostModel(lambda w: 100 * w, per_worker_bytes=1 * GiB, base_bytes=1 * GiB)
    result = tune(measure_fn=model, progress=False, local_ranks=2, available_memory_bytes=64 * GiB)
    assert result.max_workers == 3 and result.recommended_num_workers == 3 and result.local_ranks == 2
    assert "at most 3 workers per rank (2 x (workers + 1 main process) <= 8)" in result.reasons[0]
    assert "num_workers=3 is per rank, for 2 local ranks: 2 x 3 = 6 workers" in result.reasons[-1]
    assert result.to_dict()["local_ranks"] == 2
    # the memory ceiling is shared too: 80% of 8 GiB / 2 ranks = 3.2 GiB, 1 GiB + n x 1 GiB
    model = CostModel(lambda w: 100 * w, per_worker_bytes=1 * GiB, base_bytes=1 * GiB)
    result = tune(measure_fn=model, progress=False, local_ranks=2, available_memory_bytes=8 * GiB)
    assert result.recommended_num_workers == 2 and any("per rank 1/2 of it" in r for r in result.reasons)
    with pytest.raises(ValueError, match="`local_ranks` must be an int >= 1"):
        tune(measure_fn=model, progress=False, local_ranks=0)
