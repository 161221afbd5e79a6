"""The project's goals (benchmarks/_goals.py): met, NOT met, or inconclusive when the ratio of
medians and the median per-round ratio disagree; the lines and JSON of e2e_images.py and
large_photos.py. Plain tests, no pytest-benchmark fixture: ``make test`` runs them
(``pytest tests benchmarks/test_goals.py``); ``make bench`` (``--benchmark-only``) skips them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import e2e_images, tasks
from benchmarks._goals import (
    GOAL_LAYOUT,
    GOAL_SPEEDUP,
    image_goal_lines,
    image_goals,
    large_photo_goals,
)
from gpufeed.compare._compare import CompareResult, LoaderSummary, RoundResult
from gpufeed.compare._images import CV_NAME, FAST_NAME, LAYOUT_REFERENCE, PIL_NAME, ImageBenchResult
from gpufeed.compare._large_photos import CV_REDUCED_NAME, PIL_DRAFT_NAME
from gpufeed.synth import make_image_folder


def _compare(rates: dict[str, list[float]], peak_pss: dict[str, int] | None = None) -> CompareResult:
    """A comparison whose loaders ran at ``rates`` (one per round; batches/s x 64 images), the
    first loader the baseline; every peak PSS and footprint 100 bytes unless ``peak_pss`` says."""
    peak_pss = peak_pss or {}

    def rounds(name: str, per_round: list[float]) -> tuple[RoundResult, ...]:
        pss = peak_pss.get(name, 100)
        return tuple(RoundResult(name, i, 11, 11 * 64, 0.5, 10 / r, 0.5 + 10 / r, pss, float(pss), pss, 0.1)
                     for i, r in enumerate(per_round))

    loaders = tuple(LoaderSummary(n, rounds(n, r)) for n, r in rates.items())
    return CompareResult(loaders, next(iter(rates)), len(next(iter(rates.values()))), 0, 11)


def _fake_run(pil_rates, fast_rates, transform="train", num_workers=2):
    result = _compare({PIL_NAME: pil_rates, FAST_NAME: fast_rates})
    return ImageBenchResult("root", transform, 704, 64, num_workers, result, None)


@pytest.mark.parametrize("pil, fast, status", [
    ([1, 1, 1], [2.5, 2.2, 2.4], "met"),
    ([1, 1, 1], [1.5, 1.2, 1.9], "NOT met"),
    # ratio of medians 3.0/1.0 = 3.0, but per-round ratios 4.0, 1.5, 1.0 (median 1.5): noise
    ([1, 1, 3], [4, 1.5, 3], "inconclusive"),
])
def test_speed_goal_is_inconclusive_when_the_two_medians_disagree(pil, fast, status):
    (speed, *_) = image_goals(_fake_run(pil, fast))
    assert speed.name == f"train >= {GOAL_SPEEDUP:.1f}x {PIL_NAME} images/s"
    assert speed.status == status and speed.met == (status == "met")
    assert ("too noisy to call" in speed.detail) == (status == "inconclusive")


def test_goal_lines_state_the_value_and_where_the_goal_is_stated():
    lines = image_goal_lines(_fake_run([1, 1, 1], [2.5, 2.2, 2.4], num_workers=1))
    assert lines[0] == (f"goal: train >= 2.0x {PIL_NAME} images/s: met (2.40x) [median per-round ratio "
                        f"2.40x; measured at num_workers=1; the goal is stated at 2]")
    assert lines[1:] == [f"goal: peak PSS <= DataLoader's: met (1.000x) [1.00x {PIL_NAME}]",
                         f"goal: peak footprint <= DataLoader's: met (1.000x) [1.00x {PIL_NAME}]"]


def test_memory_goal_is_the_worst_ratio_over_every_dataloader_pipeline():
    result = _compare({PIL_NAME: [1, 1], CV_NAME: [1, 1], FAST_NAME: [3, 3]},
                      peak_pss={PIL_NAME: 200, CV_NAME: 80, FAST_NAME: 100})
    goals = {g.name: g for g in image_goals(ImageBenchResult("root", "eval", 704, 64, 2, result, None))}
    pss = goals["peak PSS <= DataLoader's"]
    assert pss.status == "NOT met" and pss.value == pytest.approx(1.25)
    assert pss.detail == f"0.50x {PIL_NAME}, 1.25x {CV_NAME}"


def test_without_pillow_the_speed_goal_is_not_claimed():
    result = _compare({CV_NAME: [1, 1], FAST_NAME: [2, 2]})
    run = ImageBenchResult("root", "eval", 704, 64, 2, result, None)
    assert all("images/s" not in g.name for g in image_goals(run))
    assert image_goal_lines(run)[-1] == (f"goal: eval >= 2.0x {PIL_NAME}: not measured (Pillow is "
                                         f"not installed: pip install 'gpufeed[bench]')")


def test_every_output_format_is_held_to_the_layout_goal():
    other = "FastLoader channels_last bfloat16"
    result = _compare({LAYOUT_REFERENCE.name: [1, 1, 1], other: [0.9, 0.9, 0.9]})
    run = ImageBenchResult("root", "eval", 704, 64, 2, result, None)
    (layout,) = image_goals(run)
    assert layout.name == f"{other} >= {GOAL_LAYOUT:.2f}x {LAYOUT_REFERENCE.name} images/s"
    assert layout.status == "NOT met" and layout.value == pytest.approx(0.9)
    assert image_goal_lines(run) == [f"goal: {layout.name}: NOT met (0.90x) [median per-round ratio 0.90x]"]


@pytest.mark.parametrize("transform", ["eval", "train"])
def test_large_photo_goals_against_each_pipeline(transform):
    # FastLoader over: PIL 3.33x; PIL draft 1.0x; OpenCV reduced 2.0x by the ratio of medians, but
    # per-round ratios 4.0, 1.0, 1.0 (median 1.0): noise
    result = _compare({PIL_NAME: [0.9, 0.9, 0.9], PIL_DRAFT_NAME: [3, 3, 3], CV_REDUCED_NAME: [1, 1.5, 3],
                       FAST_NAME: [4, 1.5, 3]})
    goals = {g.name.split(">= ")[1]: g for g in large_photo_goals(result, transform)}
    assert [g.status for g in goals.values()] == ["met", "NOT met", "inconclusive"]
    assert list(goals) == [f"3.0x {PIL_NAME} images/s", f"1.1x {PIL_DRAFT_NAME} images/s",
                           f"1.1x {CV_REDUCED_NAME} images/s"]
    assert all(("the goal is stated for eval" in g.detail) == (transform == "train") for g in goals.values())
    assert not any("too noisy" in g.detail for g in goals.values())


@pytest.mark.timeout(120)
def test_e2e_images_prints_and_records_the_goals(tmp_path, capsys):
    pytest.importorskip("PIL", reason="the speed goal is stated against DataLoader+PIL")
    root = tmp_path / "images"
    make_image_folder(root, num_classes=2, per_class=4, size=(120, 150), seed=3)
    out = tmp_path / "e2e.json"
    rc = e2e_images.main([str(root), "--transform", "train", "--workers", "0", "--batch-size", "2",
                          "--batches", "2", "--rounds", "1", "--warmup", "0", "--epochs", "0",
                          "--size", "64", "--resize", "72", "--no-progress", "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    report = text.split("environment:")[0]
    assert f"goal: train >= 2.0x {PIL_NAME} images/s: " in report
    assert "goal: peak PSS <= DataLoader's: " in report and "goal: peak footprint <= DataLoader's: " in report
    (run,) = json.loads(out.read_text())["runs"]
    assert {g["name"] for g in run["goals"]} == {f"train >= 2.0x {PIL_NAME} images/s",
                                                 "peak PSS <= DataLoader's", "peak footprint <= DataLoader's"}
    assert all(g["status"] in ("met", "NOT met", "inconclusive") for g in run["goals"])


# -- benchmarks/tasks.py: rows of (loader, peer, target), statuses by the same rule ------------

def test_task_rows_take_the_goal_rule_and_a_row_without_target_has_no_status():
    result = _compare({"peer": [1, 1, 3], "met": [2.5, 2.2, 2.4], "noisy": [4, 1.5, 3], "slow": [0.5, 0.5, 0.5]})
    rows = [tasks.Row("a", "met", "peer", 2.0), tasks.Row("b", "noisy", "peer", 2.0),
            tasks.Row("c", "slow", "peer", 0.9), tasks.Row("d", "met", "peer")]
    reports = [tasks.row_report(result, r) for r in rows]
    assert [r["status"] for r in reports] == ["met", "inconclusive", "NOT met", "no target"]
    assert reports[1]["ratio"] == 3.0 and reports[1]["paired"] == [4.0, 1.5, 1.0]
    lines = tasks.format_rows(rows, reports)
    assert ">=2.0x  inconclusive" in lines[2] and lines[4].split()[4:6] == ["-", "no"]


def test_task_recipes_share_a_loader_of_the_same_name(monkeypatch):
    def recipe(loaders, row):
        return lambda data, **kw: tasks.Task({n: (lambda n=n: n) for n in loaders}, (row,))

    monkeypatch.setattr(tasks, "RECIPES", {
        "x": recipe(["shared", "x"], tasks.Row("x", "x", "shared", 0.9)),
        "y": recipe(["y", "shared"], tasks.Row("y", "y", "shared", 2.0))})
    task = tasks.build(tasks.Data(Path("."), ()), ["x", "y"], batch_size=2, num_workers=0)
    assert list(task.loaders) == ["shared", "x", "y"] and [r.name for r in task.rows] == ["x", "y"]
    with pytest.raises(ValueError, match="`recipes` must name recipes of"):
        tasks.build(tasks.Data(Path("."), ()), ["z"], batch_size=2, num_workers=0)


def test_caption_shards_give_tarshards_and_webdataset_the_same_captions(tmp_path):
    from gpufeed import TarShards

    make_image_folder(tmp_path / "images", num_classes=2, per_class=3, size=(40, 50), seed=1)
    shards = tasks.write_caption_shards(tmp_path / "images", tmp_path / "shards", num_shards=2)
    assert tasks.write_caption_shards(tmp_path / "images", tmp_path / "shards", num_shards=2) == shards
    assert len(TarShards(list(tasks.write_caption_shards(tmp_path / "images", tmp_path / "x", 3)))) == 6
    captions, labels = TarShards(list(shards), label="txt"), TarShards(list(shards))
    got = {captions.target(i): labels.target(i) for i in range(len(captions))}
    classes = sorted(p.name for p in (tmp_path / "images").iterdir())
    assert len(got) == 6 and all(text.startswith(f"a photo of a {classes[y]}, ") for text, y in got.items())
    wds = pytest.importorskip("webdataset", reason="webdataset reads the same shards when installed")
    pipe = wds.WebDataset(list(shards), shardshuffle=False).decode("pil").to_tuple("jpg", "txt")
    assert {text for _, text in pipe} == set(got)
