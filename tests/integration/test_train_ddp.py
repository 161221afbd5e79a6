"""examples/train_ddp.py under torchrun (2 CPU ranks, gloo): trains, checkpoints mid-epoch, resumes."""

from __future__ import annotations

import pytest

from tests._concurrent import result as run_result

from ._torchrun import REPO, result, torchrun_chain

EXAMPLE = REPO / "examples" / "train_ddp.py"


def _run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The example stopped at step 5 (a checkpoint at step 3), then run again: it resumes (fresh
    ranks; one torchrun launcher process for both). Returns (the first run, whether it left its
    checkpoint, the second run)."""
    tmp_path = tmp_path_factory.mktemp("train-ddp")
    args = ("--fast", "--data", str(tmp_path / "data"), "--ckpt", str(tmp_path / "ckpt.pt"))
    runs = torchrun_chain(tmp_path / "launches",
                          (EXAMPLE, (*args, "--stop-after", "5"), tmp_path / "ckpt.pt"),  # a checkpoint at step 3
                          (EXAMPLE, args, None))
    first, saved = runs[0]  # saved: the checkpoint existed before the second run
    assert first.returncode == 0, first.stderr[-4000:]
    return first, saved, runs[1][0]


SIDE_BY_SIDE = {"train-ddp": (12.2, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_train_ddp_example_stops_mid_epoch_and_resumes(side_by_side):
    first, saved, second = run_result(side_by_side, "train-ddp")
    assert first.returncode == 0, first.stderr[-4000:]
    assert first.stdout.count("simulated kill") == 2 and saved
    summary = result(second, tag="SUMMARY ")
    # --fast: 64 images over 2 ranks, batch 4: 8 steps per epoch, 2 epochs
    assert summary["world"] == 2 and summary["resumed_from_step"] == 3 and summary["last_step"] == 16
    assert summary["per_rank"] == [{"steps": 13, "samples": 52}] * 2  # the rest of epoch 0, then epoch 1
    assert summary["stats"] == {"batches": 13, "images": 52}  # made by gpufeed's image path
    assert summary["final_loss"] == summary["final_loss"]  # not NaN
