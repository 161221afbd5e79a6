"""examples/train_accelerate.py under torchrun (2 CPU ranks, gloo) with the real HF Accelerate."""

from __future__ import annotations

import pytest

from tests._concurrent import result as run_result

from ._torchrun import REPO, result, torchrun_chain

pytest.importorskip("accelerate", reason="HF Accelerate is not installed (pip install 'gpufeed[accelerate]')")

EXAMPLE = REPO / "examples" / "train_accelerate.py"


def _run(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    """The example stopped at step 5 (a checkpoint at step 3), then run again: it resumes (fresh
    ranks; one torchrun launcher process for both). Returns (the first run, the files of its
    checkpoint, the second run)."""
    tmp_path = tmp_path_factory.mktemp("accelerate-example")
    args = ("--fast", "--data", str(tmp_path / "data"), "--ckpt", str(tmp_path / "ckpt"))
    runs = torchrun_chain(tmp_path / "launches",
                          (EXAMPLE, (*args, "--stop-after", "5"), tmp_path / "ckpt"),  # save_state at step 3
                          (EXAMPLE, args, None))
    first, saved = runs[0]  # saved: the checkpoint's files before the second run
    assert first.returncode == 0, first.stderr[-4000:]
    return first, set(saved), runs[1][0]


SIDE_BY_SIDE = {"accelerate-example": (15.9, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_train_accelerate_example_evaluates_exactly_and_resumes(side_by_side):
    first, saved, second = run_result(side_by_side, "accelerate-example")
    assert first.returncode == 0, first.stderr[-4000:]
    assert "simulated kill" in first.stdout
    assert {"dl_state_dict.bin", "dl_state_dict_1.bin"} <= saved
    summary = result(second, tag="SUMMARY ")
    assert summary["world"] == 2 and summary["loader"] == "AcceleratedFastLoader"
    # --fast: 60 images, batch 4, 2 ranks: 8 steps per rank and epoch (the last one padded)
    assert summary["resumed_from_step"] == 3 and summary["last_step"] == 16
    assert summary["steps_per_rank"] == [13, 13]  # the rest of epoch 0 (load_state), then epoch 1
    assert summary["images"] == 52  # decoded by gpufeed's image path on rank 0
    assert summary["eval_seen"] == summary["eval_dataset"] == 60  # gather_for_metrics: each image once
    assert 0.0 <= summary["accuracy"] <= 1.0
