"""``gpufeed doctor``: what limits loading an image folder or tar shards, on the command line.

::

    gpufeed doctor ROOT [--transform eval|train] [--step-ms N] [--workers N] [--batch-size N]
                   [--batches N] [--on-error raise|skip] [--json OUT] [--no-progress]

Builds ``FastLoader(dataset, persistent_workers=True, shuffle=True)`` over
``gpufeed.ImageFolder(ROOT, transform)``, or ``gpufeed.TarShards(ROOT, transform)`` when ROOT
names tar shards (it ends in ``.tar``: a path, a glob or a brace pattern), and runs
:func:`gpufeed.doctor.diagnose` with a simulated step that sleeps ``--step-ms`` per batch (your
model's step time; 0 asks what limits the loader flat out).
Output goes through :func:`write` (stdout); the progress bar goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpufeed._engine.context import usable_cores
from gpufeed.cli._util import add_on_error, open_image_dataset, write
from gpufeed.cli._util import non_negative_int as _non_negative_int
from gpufeed.cli._util import positive_int as _positive
from gpufeed.doctor._doctor import diagnose
from gpufeed.image._transforms import RandomResizedCrop, ResizeCenterCrop
from gpufeed.loader import FastLoader

__all__ = ["add_doctor_parser", "run_doctor", "write"]


def _milliseconds(value: str) -> float:
    ms = float(value)
    if not ms >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 milliseconds. Found: {value}.")
    return ms


def _default_workers() -> int:
    return min(8, usable_cores())


def add_doctor_parser(sub: Any) -> None:
    """Adds ``doctor`` to the ``gpufeed`` subcommands (``sub``: argparse's subparsers)."""
    p = sub.add_parser("doctor", help="run an image folder through FastLoader and name what limits "
                                      "it: read, decode, transform, workers, transfer, compute or cache")
    p.add_argument("root", metavar="ROOT", help="image folder (ROOT/CLASS/IMAGE), or WebDataset tar "
                                             "shards: a .tar path, glob or brace pattern "
                                             "(train-{0000..0127}.tar)")
    p.add_argument("--transform", choices=("eval", "train"), default="eval",
                   help="eval: ResizeCenterCrop(224, 256); train: RandomResizedCrop(224) "
                        "(default eval)")
    p.add_argument("--step-ms", type=_milliseconds, default=0.0, metavar="N",
                   help="simulated training step per batch, milliseconds; it sleeps, as a host "
                        "thread waiting on its GPU does (default 0: the loader flat out)")
    p.add_argument("--workers", type=_non_negative_int, default=None, metavar="N",
                   help="num_workers (default: usable cores, at most 8)")
    p.add_argument("--batch-size", type=_positive, default=64, metavar="N", help="batch size (64)")
    p.add_argument("--batches", type=_positive, default=100, metavar="N",
                   help="batches measured, after warm-up (default 100)")
    add_on_error(p)
    p.add_argument("--json", metavar="OUT", help="also write the report (evidence included) here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """Build the loader, diagnose it, print the report (and write ``--json``); exit status."""
    transform = ResizeCenterCrop(224, 256) if args.transform == "eval" else RandomResizedCrop(224)
    workers = _default_workers() if args.workers is None else args.workers
    dataset = open_image_dataset(args.root, transform)
    write(f"gpufeed doctor: {len(dataset)} images in {args.root}, {args.transform} transform, "
          f"num_workers={workers}, batch_size={args.batch_size}, step {args.step_ms:g} ms, "
          f"{args.batches} batches")
    with FastLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=workers,
                    persistent_workers=workers > 0, on_error=args.on_error) as loader:
        report = diagnose(loader, batches=args.batches, step_ms=args.step_ms,
                          progress=not args.no_progress)
    write(str(report))
    if args.json:
        out = report.to_dict()
        out["config"] = {"root": args.root, "transform": args.transform, "step_ms": args.step_ms,
                         "num_workers": workers, "batch_size": args.batch_size,
                         "batches": args.batches}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
            f.write("\n")
        write(f"wrote {args.json}")
    return 0
