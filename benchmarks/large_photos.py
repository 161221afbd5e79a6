"""Large photos: FastLoader against DataLoader+PIL (without and with ``Image.draft``) and
DataLoader+OpenCV (``IMREAD_REDUCED_*``) on phone-sized JPEGs, alternating rounds, one run.

    python -m benchmarks.large_photos [ROOT] [--transform eval|train] [--images 200]
        [--workers 2] [--batch-size 16] [--batches N] [--rounds 3] [--warmup 1] [--json OUT]

Without ROOT, a folder of ``--images`` phone-sized photo-like JPEGs (3000x2250 to 4000x3000,
quality 95, 2.5-4.5 MB: ``gpufeed demo --large``'s images) is made once in ./demo-large and
reused. Goals (eval): FastLoader >= 3x DataLoader+PIL, >= 1.1x PIL with draft and OpenCV reduced.
See gpufeed/compare/_large_photos.py for the pipelines, benchmarks/_goals.py for the goals.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks._goals import large_photo_goals
from gpufeed.cli.bench import format_environment, prepare_demo_data, write
from gpufeed.compare._large_photos import run_large_photo_bench


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("root", nargs="?", help="image folder (default: ./demo-large, made once)")
    p.add_argument("--transform", choices=("eval", "train"), default="eval")
    p.add_argument("--images", type=int, default=200, help="images to make without ROOT (200)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--batches", type=int, default=None, help="batches per round (one epoch)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--json", metavar="OUT")
    args = p.parse_args(argv)
    root = args.root
    if root is None:
        made, count, reused = prepare_demo_data("demo-large", args.images, large=True)
        write(f"no ROOT given: {'using' if reused else 'made'} {made} ({count} images)")
        root = str(made)
    files = [f for f in Path(root).rglob("*") if f.is_file() and not f.name.startswith(".")]
    sizes = sorted(f.stat().st_size for f in files)
    write(f"{len(files)} files in {root}, {sizes[0] / 1e6:.1f}-{sizes[-1] / 1e6:.1f} MB "
          f"(median {sizes[len(sizes) // 2] / 1e6:.1f} MB)")
    result = run_large_photo_bench(root, args.transform, num_workers=args.workers,
                                   batch_size=args.batch_size, num_batches=args.batches,
                                   num_rounds=args.rounds, num_warmup_rounds=args.warmup)
    goals = large_photo_goals(result, args.transform)
    write(f"{args.transform}, batch {args.batch_size}, num_workers={args.workers}")
    write(result.format_table())
    for g in goals:
        write(f"goal: {g.name}: {g.status} ({g.value:.2f}x) [{g.detail}]")
    write(format_environment(result.environment))
    if args.json:
        payload = {"benchmark": "large_photos", "transform": args.transform, **result.to_dict(),
                   "goals": [vars(g) for g in goals]}
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str), encoding="utf-8")
        write(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
