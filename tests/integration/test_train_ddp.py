"""examples/train_ddp.py under torchrun (2 CPU ranks, gloo): trains, checkpoints mid-epoch, resumes."""

from __future__ import annotations

import pytest

from ._torchrun import REPO, result, torchrun

EXAMPLE = REPO / "examples" / "train_ddp.py"


@pytest.mark.timeout(240)
def test_train_ddp_example_stops_mid_epoch_and_resumes(tmp_path):
    args = ("--fast", "--data", str(tmp_path / "data"), "--ckpt", str(tmp_path / "ckpt.pt"))
    first = torchrun(EXAMPLE, *args, "--stop-after", "5")  # a checkpoint at step 3, then "killed"
    assert first.returncode == 0, first.stderr[-4000:]
    assert first.stdout.count("simulated kill") == 2 and (tmp_path / "ckpt.pt").exists()
    summary = result(torchrun(EXAMPLE, *args), tag="SUMMARY ")
    # --fast: 64 images over 2 ranks, batch 4: 8 steps per epoch, 2 epochs
    assert summary["world"] == 2 and summary["resumed_from_step"] == 3 and summary["last_step"] == 16
    assert summary["per_rank"] == [{"steps": 13, "samples": 52}] * 2  # the rest of epoch 0, then epoch 1
    assert summary["stats"] == {"batches": 13, "images": 52}  # made by gpufeed's image path
    assert summary["final_loss"] == summary["final_loss"]  # not NaN
