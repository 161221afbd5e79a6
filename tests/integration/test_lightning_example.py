"""examples/train_lightning.py runs: a real Lightning training loop on the demo images."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._concurrent import result as run_result

pytest.importorskip("lightning", reason="the `lightning` extra is not installed (pip install gpufeed[lightning])")

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    tmp_path = tmp_path_factory.mktemp("lightning-example")
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, str(REPO / "examples" / "train_lightning.py"), "--fast", "--out", str(tmp_path)]
    return tmp_path, subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)


SIDE_BY_SIDE = {"lightning-example": (5.6, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_train_lightning_example_fast(side_by_side):
    tmp_path, out = run_result(side_by_side, "lightning-example")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    found = re.search(r"trained (\d+) steps; loss ([\d.]+); (\d+) images through gpufeed", out.stdout)
    assert found, out.stdout[-2000:]
    steps, loss, images = int(found[1]), float(found[2]), int(found[3])
    assert steps == 4 and images == 64 and loss > 0  # 64 demo images, batches of 16, one epoch
    assert (tmp_path / "ckpt" / "last.ckpt").is_file()
