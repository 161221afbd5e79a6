"""``gpufeed tune``: find num_workers (and read concurrency, pinning, prefetch, cache) for an
image folder or tar shards (ROOT ending in ``.tar``: a path, glob or brace pattern), local or
at a URL (``s3://``, ``http(s)://``...; ``pip install gpufeed[remote]``).

::

    gpufeed tune ROOT [--max-workers N] [--batch-size 64] [--transform eval|train]
                 [--batches N] [--warmup N] [--step-ms MS] [--memory-fraction F]
                 [--min-gain F] [--local-ranks W] [--on-error raise|skip] [--json OUT]
                 [--plot OUT.png] [--no-progress]

Under ``torchrun`` (every rank runs it at once) or with ``--local-ranks W``, the recommendation is
per rank, for W ranks sharing the host's cores and memory (:func:`gpufeed.tune.tune`).

Output goes through :func:`write` (stdout); the progress bar goes to stderr when it is a
terminal. The search itself is :func:`gpufeed.tune.tune`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufeed._observe.memory import format_bytes
from gpufeed.cli._util import add_on_error, open_image_dataset, write
from gpufeed.cli._util import non_negative_int as _non_negative
from gpufeed.cli._util import positive_int as _positive
from gpufeed.compare._environment import describe_environment
from gpufeed.image._transforms import RandomResizedCrop, ResizeCenterCrop
from gpufeed.loader import FastLoader
from gpufeed.tune._tune import tune

__all__ = ["add_tune_parser", "format_recommendation", "run_tune", "write"]

TRANSFORMS = ("eval", "train")


def _fraction(value: str) -> float:
    x = float(value)
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in [0, 1]. Found: {x}.")
    return x


def add_tune_parser(sub: Any) -> None:
    """Adds ``tune`` to the ``gpufeed`` subcommands (``sub``: argparse's subparsers)."""
    p = sub.add_parser("tune", help="measure 1, 2, 4, ... workers (and, when reads dominate, "
                                    "1, 4, 16, 64 reads in flight) on an image folder and recommend "
                                    "num_workers, read_concurrency, pin_workers, prefetch and cache")
    p.add_argument("root", metavar="ROOT", help="image folder (ROOT/CLASS/IMAGE), a local path or a "
                                                "URL (s3://, gs://, http(s)://: needs gpufeed[remote]); or "
                                                "WebDataset tar shards: a .tar path, glob or "
                                                "brace pattern (train-{0000..0127}.tar)")
    p.add_argument("--max-workers", type=_positive, default=None, metavar="N",
                   help="largest worker count tried (default: the usable cores)")
    p.add_argument("--batch-size", type=_positive, default=64, help="batch size (default 64)")
    p.add_argument("--transform", choices=TRANSFORMS, default="eval",
                   help="eval: ResizeCenterCrop(224, 256); train: RandomResizedCrop(224) with "
                        "flips and shuffling (default eval)")
    p.add_argument("--batches", type=_positive, default=20, metavar="N",
                   help="timed batches per measurement (default 20)")
    p.add_argument("--warmup", type=_non_negative, default=3, metavar="N",
                   help="untimed batches first (default 3)")
    p.add_argument("--step-ms", type=float, default=0.0, metavar="MS",
                   help="simulated training step per batch in ms (a sleep), so the data wait "
                        "means something (default 0: none)")
    p.add_argument("--memory-fraction", type=_fraction, default=0.8, metavar="F",
                   help="memory ceiling as a share of available memory (default 0.8)")
    p.add_argument("--min-gain", type=_fraction, default=0.05, metavar="F",
                   help="smallest worthwhile gain from doubling (default 0.05 = 5%%)")
    p.add_argument("--local-ranks", type=_positive, default=None, metavar="W",
                   help="ranks that will share this host (default: LOCAL_WORLD_SIZE under torchrun, "
                        "else 1): num_workers is then per rank, so that the W ranks fit the host")
    p.add_argument("--json", metavar="OUT", help="write the rows and recommendation here")
    p.add_argument("--plot", metavar="OUT.png", help="write a plot (needs matplotlib)")
    p.add_argument("--seed", type=int, default=0, help="sampling and augmentation seed (default 0)")
    add_on_error(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run_tune)


def _make_loader_factory(args: argparse.Namespace) -> Callable[[int, bool], Any]:
    import torch

    transform = ResizeCenterCrop(224, 256) if args.transform == "eval" else RandomResizedCrop(224)
    dataset = open_image_dataset(args.root, transform)
    shuffle = args.transform == "train"

    def make(num_workers: int, pin_workers: bool) -> FastLoader:
        return FastLoader(dataset, batch_size=args.batch_size, num_workers=num_workers,
                          shuffle=shuffle, generator=torch.Generator().manual_seed(args.seed),
                          persistent_workers=num_workers > 0, pin_workers=pin_workers,
                          seed=args.seed, on_error=args.on_error)

    return make


def format_recommendation(result: Any) -> str:
    """The recommendation as a FastLoader call (and the dataset's read_concurrency), then the
    reasons, one per line."""
    kwargs = [f"num_workers={result.recommended_num_workers}",
              f"prefetch_factor={result.recommended_prefetch_factor}",
              "persistent_workers=True"]
    if result.recommended_pin_workers:
        kwargs.append("pin_workers=True")
    if result.recommended_cache_bytes:
        kwargs.append(f'cache_bytes="{format_bytes(result.recommended_cache_bytes)}"')
    lines = ["recommended: FastLoader(dataset, " + ", ".join(kwargs) + ")"]
    ranks = getattr(result, "local_ranks", 1)
    if ranks > 1:
        lines.append(f"  per rank, for {ranks} local ranks on this host ({ranks} x "
                     f"{result.recommended_num_workers} workers in all)")
    rc = getattr(result, "recommended_read_concurrency", None)
    if rc is not None:
        lines.append(f"  with the dataset's read_concurrency={rc} (reads in flight per worker: "
                     f"ImageFolder(root, transform, read_concurrency={rc}), or the same "
                     f"keyword of ImageDataset / LMDBDataset / TarShards)")
    lines.append("why:")
    lines += [f"  - {reason}" for reason in result.reasons]
    return "\n".join(lines)


def run_tune(args: argparse.Namespace) -> int:
    """``gpufeed tune``: the search, its table, the recommendation; JSON and plot if asked."""
    step: Callable[[Any], None] | None = None
    if args.step_ms > 0:
        delay_s = args.step_ms / 1000.0

        def step(batch: Any) -> None:
            time.sleep(delay_s)

    t0 = time.perf_counter()
    result = tune(_make_loader_factory(args), max_workers=args.max_workers,
                  memory_fraction=args.memory_fraction, min_gain=args.min_gain,
                  batches=args.batches, warmup_batches=args.warmup, step=step,
                  progress=not args.no_progress, local_ranks=args.local_ranks)
    elapsed_s = time.perf_counter() - t0
    write(f"gpufeed tune {args.root}: transform {args.transform}, batch size {args.batch_size}, "
          f"{args.batches} timed batches per step ({elapsed_s:.0f} s)")
    write(result.format_table())
    write("")
    write(format_recommendation(result))
    if args.json:
        payload = result.to_dict()
        payload["args"] = {k: v for k, v in vars(args).items() if k != "run"}
        payload["environment"] = describe_environment(result.recommended_num_workers)
        payload["elapsed_s"] = elapsed_s
        Path(args.json).write_text(json.dumps(payload, indent=2, allow_nan=False, default=str),
                                   encoding="utf-8")
        write(f"wrote {args.json}")
    if args.plot and result.save_plot(args.plot):  # False: save_plot logged why
        write(f"wrote {args.plot}")
    return 0
