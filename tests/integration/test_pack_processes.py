"""gpufeed.pack across processes: a pack killed midway resumes to the uninterrupted result."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpufeed.sources import LMDBDataset, pack
from tests.unit.test_pack import (
    KILL_AFTER_COMMITS,
    lmdb_content,
    src,  # noqa: F401 (fixtures, used by name)
)


@pytest.mark.timeout(120)
def test_a_pack_killed_midway_resumes_to_the_uninterrupted_result(src, tmp_path):
    dst = tmp_path / "db.lmdb"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.run([sys.executable, "-c", KILL_AFTER_COMMITS, str(src), str(dst)],
                          env=env, timeout=100)
    assert proc.returncode == -9 and not dst.exists()
    result = pack(src, dst, progress=False, workers=2)
    assert result.resumed_from == 4  # one sample per transaction: four were committed
    pack(src, tmp_path / "fresh.lmdb", progress=False)
    assert lmdb_content(dst) == lmdb_content(tmp_path / "fresh.lmdb")
    assert LMDBDataset(dst).read(9) == (src / "class_01" / "img_00004.jpg").read_bytes()
