"""COCO annotation files at train2017's size: seconds to build the dataset, peak and kept memory.

    PYTHONPATH=$PWD .venv-tv/bin/python -m benchmarks.coco_parse [OUT_DIR] [--images 118000]
        [--annotations 860000] [--rounds 3] [--builders NAME,...]

Writes (once, into OUT_DIR, default ./demo-coco-parse) a COCO instances file with ``--images``
images and ``--annotations`` annotations, as train2017 has (118,287 and 860,001): 1-3 polygons
of 6-30 points each, coordinates to two decimals as COCO gives them, and 1% crowd annotations
with list-count RLEs; the images themselves are not needed. Then builds, each in a fresh
process, in alternating rounds (medians reported):

- ``gpufeed.CocoDetection(root, annFile, target_keys=[boxes, labels, masks])``;
- ``pycocotools.coco.COCO(annFile)`` (what torchvision's ``CocoDetection`` builds, and keeps);
- ``torchvision.datasets.CocoDetection(root, annFile)`` when torchvision imports.

Per loader: seconds to build (imports excluded), the process's peak RSS while building, and its
RSS once built (what each worker or rank keeps), and their ratios to gpufeed's.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks._common import uptime

DEFAULT_OUT = Path("demo-coco-parse")

#: name -> (imports, the statement that builds the dataset) run in a fresh process
BUILDERS = {
    "gpufeed CocoDetection": ("import gpufeed",
                              "gpufeed.CocoDetection(ROOT, ANN, target_keys=['boxes', 'labels', 'masks'])"),
    "pycocotools COCO": ("from pycocotools.coco import COCO", "COCO(ANN)"),
    "torchvision CocoDetection": ("import torchvision", "torchvision.datasets.CocoDetection(ROOT, ANN)"),
}

_CHILD = """
import gc, io, contextlib, json, resource, sys, time
ROOT, ANN = sys.argv[1], sys.argv[2]
{imports}
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints its progress
    dataset = {build}
seconds = time.perf_counter() - t0
gc.collect()
print(json.dumps({{"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "kept_rss": rss(), "images": len(getattr(dataset, "imgs", dataset))}}))
"""


def _polygon(rng: random.Random, w: int, h: int) -> list[float]:
    cx, cy = rng.uniform(0, w), rng.uniform(0, h)
    return [round(v, 2) for _ in range(rng.randint(6, 30))
            for v in (min(w, max(0.0, cx + rng.uniform(-60, 60))), min(h, max(0.0, cy + rng.uniform(-60, 60))))]


def write_annotations(path: Path, images: int, annotations: int, seed: int = 0) -> None:
    """A COCO instances file of ``images`` 640 x 480 images and ``annotations`` objects."""
    rng = random.Random(seed)
    w, h = 640, 480
    entries = []
    for j in range(annotations):
        x, y = round(rng.uniform(0, 500), 2), round(rng.uniform(0, 380), 2)
        bw, bh = round(rng.uniform(1, w - x), 2), round(rng.uniform(1, h - y), 2)
        crowd = rng.random() < 0.01
        if crowd:  # an uncompressed RLE, as COCO gives its crowd regions
            runs, left = [], w * h
            while left > 0:
                run = min(left, rng.randint(1, 4000))
                runs.append(run)
                left -= run
            seg: Any = {"counts": runs, "size": [h, w]}
        else:
            seg = [_polygon(rng, w, h) for _ in range(rng.randint(1, 3))]
        entries.append({"segmentation": seg, "area": round(bw * bh * 0.6, 4), "iscrowd": int(crowd),
                        "image_id": rng.randint(1, images), "bbox": [x, y, bw, bh],
                        "category_id": rng.randint(1, 90), "id": j + 1})
    data = {"images": [{"id": i + 1, "file_name": f"{i + 1:012d}.jpg", "height": h, "width": w}
                       for i in range(images)],
            "annotations": entries, "categories": [{"id": c, "name": f"c{c}"} for c in range(1, 91)]}
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def build_once(name: str, root: Path, ann: Path) -> dict[str, Any]:
    """One build of ``name`` in a fresh process: seconds, peak_rss, kept_rss (bytes)."""
    imports, build = BUILDERS[name]
    code = _CHILD.format(imports=imports, build=build)
    out = subprocess.run([sys.executable, "-c", code, str(root), str(ann)], capture_output=True, text=True,
                         timeout=3600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def available(name: str) -> bool:
    """Whether builder ``name``'s module is installed (found, not imported: an import that fails
    anyway fails its build, with the child's error)."""
    module = BUILDERS[name][0].split()[1]
    return importlib.util.find_spec(module.split(".")[0]) is not None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    p.add_argument("--images", type=int, default=118_000)
    p.add_argument("--annotations", type=int, default=860_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--builders", default=",".join(BUILDERS),
                   help="comma-separated names of BUILDERS to run (default: all that import)")
    args = p.parse_args(argv)
    wanted = [n.strip() for n in args.builders.split(",") if n.strip()]
    unknown = sorted(set(wanted) - set(BUILDERS))
    if unknown:
        p.error(f"--builders must name builders of {sorted(BUILDERS)}. Found: {unknown}.")
    args.out.mkdir(parents=True, exist_ok=True)
    ann = args.out / f"instances-{args.images}-{args.annotations}.json"
    if not ann.exists():
        print(f"writing {ann} ...", flush=True)
        write_annotations(ann, args.images, args.annotations)
    names = [n for n in wanted if available(n)]
    before = uptime()
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            runs[name].append(build_once(name, args.out, ann))
    med = {n: {k: statistics.median(run[k] for run in runs[n]) for k in ("seconds", "peak_rss", "kept_rss")}
           for n in names}
    base = med[names[0]]
    mib = 1 << 20
    print(f"{ann.name}: {ann.stat().st_size / 1e6:.0f} MB, {args.images} images, {args.annotations} "
          f"annotations; {args.rounds} rounds, each build in a fresh process, alternating; medians")
    print(f"{'builder':28s} {'seconds':>8s} {'peak RSS':>10s} {'kept RSS':>10s} {'time x':>7s} "
          f"{'peak x':>7s} {'kept x':>7s}")
    for n in names:
        m = med[n]
        print(f"{n:28s} {m['seconds']:8.1f} {m['peak_rss'] / mib:8.0f}Mi {m['kept_rss'] / mib:8.0f}Mi "
              f"{m['seconds'] / base['seconds']:7.2f} {m['peak_rss'] / base['peak_rss']:7.2f} "
              f"{m['kept_rss'] / base['kept_rss']:7.2f}")
    print("(x: the builder's figure over gpufeed's)")
    print(f"uptime before: {before}\nuptime after:  {uptime()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
