"""The image benchmark with worker processes: train order with a worker, and `gpufeed bench` / `gpufeed demo` runs."""

from __future__ import annotations

import json
import re

import pytest

from gpufeed.cli import main
from gpufeed.cli.bench import DEMO_MARKER
from gpufeed.compare._images import (
    CV_NAME,
    FAST_NAME,
    PIL_NAME,
)
from tests.unit.test_bench_images import (
    TRAIN_OPENCV_TOLERANCE,
    _first_batches,
    folder,  # noqa: F401 (fixtures, used by name)
)


@pytest.mark.timeout(120)
def test_train_order_is_the_same_with_a_worker(folder):
    batches = _first_batches(folder, "train", num_workers=1, batch_size=4)
    labels = [b[1].tolist() for b in batches.values()]
    assert labels[0] == labels[1] == labels[2]
    fast, cv = batches[FAST_NAME][0].float(), batches[CV_NAME][0].float()
    assert (fast - cv).abs().mean() <= TRAIN_OPENCV_TOLERANCE


@pytest.mark.timeout(120)
def test_bench_cli_runs_and_writes_json(folder, tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = main(["bench", str(folder), "--transform", "train", "--workers", "1", "--batch-size", "4",
               "--batches", "2", "--rounds", "1", "--warmup", "0", "--epochs", "2",
               "--no-progress", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    for needle in (PIL_NAME, CV_NAME, FAST_NAME, "environment:", "decoders:", "memory over 2 epoch(s)",
                   f"{FAST_NAME} / {PIL_NAME} per round:"):
        assert needle in text, needle
    # figures and ratios, no verdicts (the project's goals are benchmarks/e2e_images.py's)
    assert not any(word in text for word in ("goal", "NOT met", "inconclusive", " met "))
    payload = json.loads(out.read_text(), parse_constant=lambda c: pytest.fail(f"non-JSON {c}"))
    (run,) = payload["runs"]
    assert run["transform"] == "train" and run["num_workers"] == 1 and run["num_images"] == 12
    assert [lo["name"] for lo in run["loaders"]] == [PIL_NAME, CV_NAME, FAST_NAME]
    assert all(len(lo["rounds"]) == 1 and lo["rounds"][0]["num_samples"] == 8 for lo in run["loaders"])
    assert run["ratios"][FAST_NAME][f"images_per_s_vs_{PIL_NAME}"] > 0
    assert len(run["flatness"]["pss_bytes"]) == 2
    assert run["environment"]["num_workers"] == 1 and "decoders" in run["environment"]
    assert "goals" not in run


@pytest.mark.timeout(120)
def test_demo_generates_once_then_reuses(tmp_path, capsys):
    demo = tmp_path / "demo"
    argv = ["demo", "--dir", str(demo), "--images", "40", "--batch-size", "8", "--batches", "2",
            "--rounds", "1", "--warmup", "0", "--epochs", "1", "--workers", "1", "--no-progress"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "generated 40 images in 10 classes" in first
    assert "eval: 40 images" in first and "train: 40 images" in first and "summary: eval" in first
    # figures and ratios, no verdicts: images/s of both, their ratio, peak memory of both
    assert not any(word in first for word in ("goal:", "NOT met", "inconclusive", " met "))
    summary = next(line for line in first.splitlines() if line.startswith("summary: "))
    assert re.search(r"eval \d+ vs \d+ images/s = \d+\.\d\dx DataLoader\+\w+, peak PSS "
                     r"[\d.]+ MiB vs [\d.]+ MiB = \d+\.\d\dx", summary), summary
    assert "uint8" in first and "dtype=torch.float32" in first  # the ToTensor hint
    assert (demo / DEMO_MARKER).exists() and len(list(demo.glob("class_*/*.jpg"))) == 40
    assert main(argv) == 0
    assert "reused 40 images" in capsys.readouterr().out
