"""The ``gpufeed`` command line: a thin dispatcher, each subcommand's work lives in its module.

::

    gpufeed --version
    gpufeed pack SRC_FOLDER DST.lmdb [--max-side N] [--quality Q] [--workers N] [--no-verify]
                 [--on-error raise|skip] [--no-progress]
    gpufeed pack SRC_FOLDER DST_DIR --format tar [--shard-mb N] [...]
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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from gpufeed import __version__
from gpufeed.cli import bench as cli_bench
from gpufeed.cli import doctor as cli_doctor
from gpufeed.cli import tune as cli_tune
from gpufeed.cli._util import add_on_error, cli_text, write
from gpufeed.decoders import backends
from gpufeed.errors import GpufeedError
from gpufeed.sources import PackResult, TarPackResult, pack, pack_tar

Command = Callable[[argparse.Namespace], int]

#: What the image check costs a pack, as measured by benchmarks/pack_verify.py (its docstring).
VERIFY_COST = ("packs about 2.5x faster: the check adds ~0.4 ms of CPU per ~400x350 JPEG, 3.7x "
               "the rest of such a pack (measured on 2 cores: benchmarks/pack_verify.py)")


def _pack_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``pack`` and ``pack_tar`` share, from the command line."""
    return dict(max_side=args.max_side, quality=args.quality, progress=not args.no_progress,
                workers=args.workers, verify=not args.no_verify, on_error=args.on_error)


def _write_packed(result: PackResult | TarPackResult, into: str, resumed: str, skipped_where: str = "") -> None:
    """Report a pack's result (an LMDB's or tar shards'): counts, sizes, time, the files skipped."""
    checked = "" if result.verified else ", not checked: --no-verify"
    write(f"packed {result.count} images {into} "
          f"({result.bytes_read / 1e6:.1f} MB -> {result.bytes_written / 1e6:.1f} MB, "
          f"{result.reencoded} re-encoded, {result.seconds:.1f} s{resumed}{checked})")
    if result.skipped:
        n = len(result.skipped)
        shown = ", ".join(result.skipped[:5]) + (", ..." if n > 5 else "")
        write(f"skipped {n} {'file that does' if n == 1 else 'files that do'} not decode "
              f"(--on-error skip): {shown}{skipped_where}")


def _pack(args: argparse.Namespace) -> int:
    if args.format == "tar":
        return _pack_tar(args)
    result = pack(args.src, args.dst, **_pack_options(args))
    resumed = f", resumed at sample {result.resumed_from}" if result.resumed_from else ""
    _write_packed(result, f"in {len(result.classes)} classes into {result.path}", resumed,
                  "; the LMDB's metadata lists them all (\"skipped\")")
    return 0


def _pack_tar(args: argparse.Namespace) -> int:
    result = pack_tar(args.src, args.dst, shard_bytes=args.shard_mb << 20, **_pack_options(args))
    resumed = (f", resumed after {result.resumed_from_shard} shards"
               if result.resumed_from_shard else "")
    _write_packed(result, f"into {len(result.shards)} tar shards in {args.dst}", resumed)
    return 0


def _backends(args: argparse.Namespace) -> int:
    write(json.dumps(backends(), indent=2))
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

    p = sub.add_parser("pack", help="pack an image folder (ImageFolder layout) into an LMDB or "
                                    "WebDataset tar shards, checking that every image decodes")
    p.add_argument("src", metavar="SRC_FOLDER", help="root of CLASS/IMAGE folders")
    p.add_argument("dst", metavar="DST", help="the LMDB file to create (must not exist), or with "
                                              "--format tar the shard directory (a rerun resumes "
                                              "an interrupted pack there)")
    p.add_argument("--max-side", type=int, default=None, metavar="N",
                   help="downscale so the longer side is at most N pixels (re-encodes as JPEG)")
    p.add_argument("--quality", type=int, default=None, metavar="Q",
                   help="re-encode every image as JPEG at quality Q (1-100)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="threads reading, checking and re-encoding images (default: the CPU count, "
                        "at most 8)")
    p.add_argument("--no-verify", action="store_true",
                   help="store images without decoding them (a header check only): "
                        f"{VERIFY_COST}; a truncated or corrupt file then fails in training")
    add_on_error(p, "the loader")
    p.add_argument("--format", choices=("lmdb", "tar"), default="lmdb",
                   help="lmdb: one LMDB file (default); tar: a directory DST of WebDataset tar "
                        "shards with sidecar indexes (gpufeed.TarShards, webdataset)")
    p.add_argument("--shard-mb", type=int, default=256, metavar="N",
                   help="with --format tar: target shard size in MiB (default 256)")
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
    """Run the ``gpufeed`` command line with ``argv`` (default ``sys.argv[1:]``); exit status.

    Errors a user can act on (bad input, a file that does not decode, a worker that died) are
    one line on stderr (and a line per note: where it happened, how to resume), no traceback
    (a worker's traceback with ``--verbose``); warnings are one line each, without the
    library's source line.
    """
    return run_command(build_parser().parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.run`` (arguments parsed by :func:`build_parser`) as :func:`main` does: logging
    set up, errors a user can act on as one line, Ctrl-C as "interrupted"; exit status. For a
    script that runs a subcommand with arguments of its own (``benchmarks/e2e_images.py``)."""
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    run: Command = args.run
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning(args.command)
        try:
            return run(args)
        except (OSError, ValueError, GpufeedError) as exc:  # user errors: no traceback
            _say(args.command, f"error: {exc}", exc, args.verbose)
            return 1
        except KeyboardInterrupt as exc:  # Ctrl-C: the loaders have stopped their workers
            _say(args.command, "interrupted", exc, args.verbose)
            return 130


def _say(command: str, text: str, exc: BaseException, verbose: bool = False) -> None:
    """``text`` and ``exc``'s notes on stderr, as the command line words them: the first line
    of each note (where it happened, how to resume), whole notes (a worker's traceback) with
    ``--verbose``."""
    lines = [f"gpufeed {command}: {cli_text(text)}"]
    for note in getattr(exc, "__notes__", ()):
        note = str(note) if verbose else str(note).split("\n", 1)[0]
        lines.append(f"  {_unprefixed(cli_text(note), command)}")
    sys.stderr.write("\n".join(lines) + "\n")


def _unprefixed(text: str, command: str) -> str:
    """``text`` without a leading "gpufeed COMMAND: " (the command line's own prefix says it)."""
    prefix = f"gpufeed {command}: "
    return text[len(prefix):] if text.startswith(prefix) else text


def _one_line_warning(command: str) -> Callable[..., None]:
    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        stream = sys.stderr if file is None else file
        try:
            text = _unprefixed(cli_text(str(message)), command)
            stream.write(f"gpufeed {command}: warning: {text}\n")
        except (OSError, ValueError):  # stderr closed: a warning must not fail the command
            pass

    return show
