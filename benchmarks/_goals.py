"""The project's goals for the image benchmarks, and whether a run met them: end to end
(``e2e_images.py``: speed, output formats, memory) and large photos (``large_photos.py``).
``gpufeed bench`` itself prints figures and ratios only; the goals are stated here.

A goal's status is "met", "NOT met", or "inconclusive": the ratio of medians and the median of
the per-round ratios fall on different sides of the target (the machine was too noisy to call).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from gpufeed.compare._compare import CompareResult
from gpufeed.compare._images import CV_NAME, FAST_NAME, LAYOUT_REFERENCE, PIL_NAME, ImageBenchResult
from gpufeed.compare._large_photos import CV_REDUCED_NAME, PIL_DRAFT_NAME

GOAL_SPEEDUP = 2.0  # FastLoader images/s over DataLoader+PIL, eval and train, at num_workers=2
GOAL_NUM_WORKERS = 2
GOAL_LAYOUT = 0.95  # every (layout, dtype) of FastLoader's output over NCHW float32, images/s
# FastLoader images/s over each pipeline's, eval transform (benchmarks/README.md, "Large photos")
LARGE_PHOTO_GOALS = {PIL_NAME: 3.0, PIL_DRAFT_NAME: 1.1, CV_REDUCED_NAME: 1.1}
# FastLoader images/s over each peer, per detection/segmentation recipe (benchmarks/detection.py:
# det_ssd, inst_seg, sem_seg): torch's DataLoader with the same torchvision v2 pipeline,
# and an equivalent Albumentations 2.0.8 pipeline in DataLoader
DETECTION_GOALS = {"vs DataLoader": 2.0, "vs Albumentations": 1.5}
NOISY = "too noisy to call: raise --rounds, on a quieter machine"


@dataclass(frozen=True)
class Goal:
    """One goal and whether this run met it. ``value``/``target`` are ratios; ``status``: see
    the module docstring ("met" or "NOT met" from ``met`` when not given)."""

    name: str
    value: float
    target: float
    met: bool
    detail: str = ""
    status: str = ""

    def __post_init__(self) -> None:
        if not self.status:
            object.__setattr__(self, "status", "met" if self.met else "NOT met")


def speed_goal(result: CompareResult, name: str, ref: str, target: float, label: str,
                notes: tuple[str, ...] = (), noisy_hint: bool = True) -> Goal:
    """``name``'s images/s over ``ref``'s against ``target``; inconclusive when the ratio of
    medians and the median per-round ratio disagree (``noisy_hint``: then say what to do)."""
    value = result.ratio(name, ref)
    paired = statistics.median(result.paired_ratios(name, ref))
    met = value >= target
    status = "" if met == (paired >= target) else "inconclusive"
    details = [f"median per-round ratio {paired:.2f}x", *notes]
    if status and noisy_hint:
        details.append(NOISY)
    return Goal(label, value, target, met and not status, "; ".join(details), status)


def image_goals(run: ImageBenchResult) -> list[Goal]:
    """Speed (>= 2.0x DataLoader+PIL images/s, stated at num_workers=2), layouts (every
    FastLoader output format >= 0.95x NCHW float32's images/s, when both ran) and memory
    (peak PSS and footprint <= every DataLoader pipeline's)."""
    result = run.result
    names = [s.name for s in result.loaders]
    goals = []
    if FAST_NAME in names and PIL_NAME in names:
        notes = () if run.num_workers == GOAL_NUM_WORKERS else (
            f"measured at num_workers={run.num_workers}; the goal is stated at {GOAL_NUM_WORKERS}",)
        goals.append(speed_goal(result, FAST_NAME, PIL_NAME, GOAL_SPEEDUP,
                                 f"{run.transform} >= {GOAL_SPEEDUP:.1f}x {PIL_NAME} images/s", notes))
    fast = [n for n in names if n.startswith(FAST_NAME)]
    layout_ref = LAYOUT_REFERENCE.name
    if layout_ref in names and len(fast) > 1:
        for n in fast:
            if n == layout_ref:
                continue
            goals.append(speed_goal(result, n, layout_ref, GOAL_LAYOUT,
                                     f"{n} >= {GOAL_LAYOUT:.2f}x {layout_ref} images/s"))
    refs = [n for n in names if not n.startswith(FAST_NAME)]
    if FAST_NAME in names and refs:
        for label, ratio in (("peak PSS", result.memory_ratio), ("peak footprint", result.footprint_ratio)):
            worst = max(ratio(FAST_NAME, r) for r in refs)
            detail = ", ".join(f"{ratio(FAST_NAME, r):.2f}x {r}" for r in refs)
            goals.append(Goal(f"{label} <= DataLoader's", worst, 1.0, worst <= 1.0, detail))
    return goals


def image_goal_lines(run: ImageBenchResult) -> list[str]:
    """The ``goal:`` lines ``e2e_images.py`` prints after a run's report, one per goal, and the
    speed goal's "not measured" line when the DataLoader pipelines ran without Pillow."""
    lines = []
    for g in image_goals(run):
        digits = 3 if math.isfinite(g.value) and abs(g.value - g.target) < 0.005 else 2
        value = f"{g.value:.{digits}f}x" if math.isfinite(g.value) else "n/a"
        detail = f" [{g.detail.strip()}]" if g.detail else ""
        lines.append(f"goal: {g.name}: {g.status} ({value}){detail}")
    names = [s.name for s in run.result.loaders]
    if PIL_NAME not in names and CV_NAME in names:  # the DataLoader pipelines ran, without PIL
        lines.append(f"goal: {run.transform} >= {GOAL_SPEEDUP:.1f}x {PIL_NAME}: not measured "
                     f"(Pillow is not installed: pip install 'gpufeed[bench]')")
    return lines


def annotate_image_run(run: ImageBenchResult) -> tuple[list[str], dict[str, Any]]:
    """For ``gpufeed bench``'s ``run_bench(annotate=...)``: the goal lines, and ``goals`` in the
    run's JSON entry."""
    return image_goal_lines(run), {"goals": [vars(g) for g in image_goals(run)]}


def large_photo_goals(result: CompareResult, transform: str) -> list[Goal]:
    """FastLoader over each pipeline of :data:`LARGE_PHOTO_GOALS` (stated for eval)."""
    goals = []
    notes = () if transform == "eval" else ("the goal is stated for eval",)
    for ref, target in LARGE_PHOTO_GOALS.items():
        goals.append(speed_goal(result, FAST_NAME, ref, target,
                                 f"{transform} {FAST_NAME} >= {target:.1f}x {ref} images/s", notes,
                                 noisy_hint=False))
    return goals
