"""Local ranks on one host under torchrun (CPU ranks, gloo; each rank on the first two CPUs it
may use): pinned workers of 2 ranks on disjoint CPUs, of 4 ranks two per CPU, with an affinity a
rank sets itself; ``gpufeed tune`` per rank; the doctor's "host" verdict (_ranks_script.py)."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from gpufeed.synth import make_image_folder
from tests._concurrent import result as run_result

from ._torchrun import REPO, result, torchrun

SCRIPT = REPO / "tests" / "integration" / "_ranks_script.py"

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs")


def _two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("ranks-2") / "images"
    make_image_folder(root, num_classes=2, per_class=8, size=(64, 80))
    return result(torchrun(SCRIPT, "--tune", str(root), "--doctor", nproc=2, timeout=170))


def _four_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return result(torchrun(SCRIPT, nproc=4, timeout=170))


SIDE_BY_SIDE = {"ranks-2": (7.0, _two_ranks), "ranks-4": (6.0, _four_ranks)}  # see tests/conftest.py


@pytest.mark.timeout(400)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_two_ranks_pin_their_workers_to_disjoint_cpus(side_by_side):
    run = run_result(side_by_side, "ranks-2")
    cpus = run["cpus"][0]
    assert run["split"] == [[cpus[0]], [cpus[1]]]  # no CPU in both ranks' worker sets, none idle


@pytest.mark.timeout(400)
def test_an_affinity_each_rank_sets_itself_is_split_among_the_ranks_that_share_it(side_by_side):
    run = run_result(side_by_side, "ranks-2")
    cpus = run["cpus"][0]
    # rank 0 keeps only the second CPU; rank 1, on both, leaves it to rank 0 and takes the first
    assert run["own"] == [[cpus[1]], [cpus[0]]]


@pytest.mark.timeout(400)
def test_four_ranks_on_two_cpus_put_two_ranks_workers_on_each_cpu(side_by_side):
    run = run_result(side_by_side, "ranks-4")
    cpus = run["cpus"][0]
    assert all(len(s) == 1 for s in run["split"])
    assert Counter(s[0] for s in run["split"]) == {cpus[0]: 2, cpus[1]: 2}


@pytest.mark.timeout(400)
def test_tune_under_two_ranks_recommends_a_per_rank_count_that_fits(side_by_side):
    run = run_result(side_by_side, "ranks-2")
    counts = [t["num_workers"] for t in run["tune"]]
    assert counts == [1, 1] and sum(counts) <= 2  # two cores, two ranks
    for answer in run["tune"]:
        assert "per rank, for 2 local ranks on this host" in answer["text"]
        assert "num_workers=1 is per rank, for 2 local ranks" in answer["text"]


@pytest.mark.timeout(400)
def test_the_doctor_names_an_oversubscribed_host(side_by_side):
    run = run_result(side_by_side, "ranks-2")
    for report in run["doctor"]:  # 2 ranks x 4 workers on 2 cores
        assert report["bottleneck"] == "host", report
        assert report["local_ranks"] == 2 and report["host_workers"] == 8
        assert report["fix"].startswith("num_workers=1 per rank for 2 local ranks")
