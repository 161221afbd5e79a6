"""The ``gpufeed`` command line: a thin dispatcher, each subcommand's work lives in its module.

::

    gpufeed --version
    gpufeed pack SRC_FOLDER DST.lmdb [--max-side N] [--quality Q] [--workers N] [--no-progress]
    gpufeed backends
    gpufeed bench ROOT [--transform eval|train] [--workers N ...] [--json OUT]   (gpufeed.cli.bench)
    gpufeed demo [--dir DIR] [--images N]                                       (gpufeed.cli.bench)
    gpufeed tune ROOT [--max-workers N] [--json OUT] [--plot OUT.png]           (gpufeed.cli.tune)
    gpufeed doctor ROOT [--transform eval|train] [--step-ms N] [--json OUT]     (gpufeed.cli.doctor)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence

from gpufeed import __version__
from gpufeed.cli import bench as cli_bench
from gpufeed.cli import doctor as cli_doctor
from gpufeed.cli import tune as cli_tune
from gpufeed.decode import backends
from gpufeed.sources import pack

Command = Callable[[argparse.Namespace], int]


def _pack(args: argparse.Namespace) -> int:
    result = pack(args.src, args.dst, max_side=args.max_side, quality=args.quality,
                  progress=not args.no_progress, workers=args.workers)
    resumed = f", resumed at sample {result.resumed_from}" if result.resumed_from else ""
    sys.stdout.write(f"packed {result.count} images in {len(result.classes)} classes into "
                     f"{result.path} ({result.bytes_read / 1e6:.1f} MB -> "
                     f"{result.bytes_written / 1e6:.1f} MB, {result.reencoded} re-encoded, "
                     f"{result.seconds:.1f} s{resumed})\n")
    return 0


def _backends(args: argparse.Namespace) -> int:
    sys.stdout.write(json.dumps(backends(), indent=2) + "\n")
    return 0


def _version() -> str:
    return __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand; each sets ``args.run``."""
    parser = argparse.ArgumentParser(prog="gpufeed", description="gpufeed: keeps GPUs fed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    parser.add_argument("--version", action="version", version=f"gpufeed {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("pack", help="pack an image folder (ImageFolder layout) into an LMDB")
    p.add_argument("src", metavar="SRC_FOLDER", help="root of CLASS/IMAGE folders")
    p.add_argument("dst", metavar="DST.lmdb", help="LMDB to create (must not exist)")
    p.add_argument("--max-side", type=int, default=None, metavar="N",
                   help="downscale so the longer side is at most N pixels (re-encodes as JPEG)")
    p.add_argument("--quality", type=int, default=None, metavar="Q",
                   help="re-encode every image as JPEG at quality Q (1-100)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads reading and re-encoding images (default: the CPU count, at most 8)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=_pack)

    p = sub.add_parser("backends", help="print the active image decoders as JSON")
    p.set_defaults(run=_backends)

    cli_bench.add_bench_parser(sub)
    cli_bench.add_demo_parser(sub)

    cli_tune.add_tune_parser(sub)

    cli_doctor.add_doctor_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``gpufeed`` command line with ``argv`` (default ``sys.argv[1:]``); exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    run: Command = args.run
    try:
        return run(args)
    except (OSError, ValueError) as exc:  # user errors: one line, no traceback
        sys.stderr.write(f"gpufeed {args.command}: error: {exc}\n")
        return 1
    except KeyboardInterrupt:  # Ctrl-C: one line; the loaders have stopped their workers
        sys.stderr.write(f"gpufeed {args.command}: interrupted\n")
        return 130
