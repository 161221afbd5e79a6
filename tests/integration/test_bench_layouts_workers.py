"""`gpufeed bench --dtype/--channels-last` with a worker process: every output format's images/s
as a ratio to NCHW float32's."""

from __future__ import annotations

import json
import re

import pytest

from gpufeed.cli import main
from gpufeed.compare._images import LAYOUT_REFERENCE
from tests.unit.test_bench_layouts import folder  # noqa: F401 (fixtures, used by name)


@pytest.mark.timeout(180)
def test_bench_cli_compares_every_format_with_nchw_float32(folder, tmp_path, capsys):
    out = tmp_path / "layouts.json"
    rc = main(["bench", str(folder), "--dtype", "uint8,bfloat16", "--channels-last", "--no-reference",
               "--workers", "1", "--batch-size", "2", "--batches", "2", "--rounds", "1",
               "--warmup", "0", "--epochs", "0", "--size", "64", "--resize", "72", "--no-progress",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    names = [LAYOUT_REFERENCE.name, "FastLoader channels_last uint8", "FastLoader channels_last bfloat16"]
    table = text.split("environment:")[0]
    assert " x f32 " in table and "x f32: over FastLoader NCHW float32" in table
    for name in names:
        assert re.search(rf"^{name} .* \d+\.\d\dx ", table, re.M), name  # its ratio to NCHW float32
    assert "goal" not in text
    assert "DataLoader" not in text.split("environment:")[0]
    (run,) = json.loads(out.read_text())["runs"]
    assert [lo["name"] for lo in run["loaders"]] == names
    assert run["baseline"] == LAYOUT_REFERENCE.name
