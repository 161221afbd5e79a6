"""Transport benchmark: gpufeed's FastLoader vs torch's DataLoader, in one run, alternating.

Samples are 3x224x224 uint8 tensors that cost one memset to make, so what is measured is how
batches get from the worker processes to the main process. Both loaders get the same dataset
and arguments (batch 64, num_workers=2 by default). Reported: median steady-state batches/s per
loader, the ratio FastLoader / DataLoader, and peak PSS summed over the main process and its
workers. Goal: ratio >= 1.5 at equal or lower peak PSS.

    python -m benchmarks.transport [--batches N] [--rounds R] [--workers 2] [--batch-size 64] [--json OUT]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch

from gpufeed.compare import SyntheticImageDataset, compare, describe_environment, format_bytes
from gpufeed.compare._compare import touch_batch, touch_pages

CONSUMERS = {"pages": touch_pages, "element": touch_batch}

GOAL_SPEEDUP = 1.5


def load_class(spec: str) -> type:
    """``"package.module:Name"`` -> the object."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        raise SystemExit(f"--candidate/--baseline must look like 'module:Name'. Found: {spec!r}.")
    return getattr(importlib.import_module(module_name), attr)


def check_batches(name: str, factory: Callable[[], Iterable[Any]], batch_size: int, shape: tuple[int, ...]) -> None:
    """Reads 3 batches in full and checks shape, dtype and values (sample i is filled with i % 256)."""
    loader = factory()
    it = iter(loader)
    try:
        for b in range(3):
            batch = next(it)
            if not isinstance(batch, torch.Tensor):
                raise SystemExit(f"{name}: batch {b} is a {type(batch).__name__}, expected a torch.Tensor")
            if tuple(batch.shape) != (batch_size, *shape) or batch.dtype != torch.uint8:
                raise SystemExit(f"{name}: batch {b} has shape {tuple(batch.shape)} {batch.dtype}")
            expected = (torch.arange(b * batch_size, (b + 1) * batch_size) % 256).to(torch.uint8)
            flat = batch.reshape(batch_size, -1)
            if not (torch.equal(flat.min(dim=1).values, expected) and torch.equal(flat.max(dim=1).values, expected)):
                raise SystemExit(f"{name}: batch {b} holds the wrong samples")
            del batch, flat
    finally:
        del it, loader


def _parser() -> argparse.ArgumentParser:
    """The command line: every option and its default."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=150, help="batches per round (default 150)")
    p.add_argument("--rounds", type=int, default=5, help="counted rounds per loader (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted rounds per loader first (default 1)")
    p.add_argument("--workers", type=int, default=2, help="num_workers for both loaders (default 2)")
    p.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--prefetch-factor", type=int, default=None, help="prefetch_factor for both (default: torch's)")
    p.add_argument(
        "--consume",
        choices=sorted(CONSUMERS),
        default="pages",
        help="per batch, read one byte per 4 KiB page (default: every page is mapped and counted in PSS) "
        "or one element only (pages never read stay unmapped and uncounted)",
    )
    p.add_argument("--json", metavar="OUT", help="also write the result as JSON to OUT")
    p.add_argument("--candidate", default="gpufeed:FastLoader", help="loader under test, module:Name")
    p.add_argument("--baseline", default="torch.utils.data:DataLoader", help="reference loader, module:Name")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    try:
        candidate_cls = load_class(args.candidate)
    except (ImportError, AttributeError) as exc:
        print(
            f"cannot import {args.candidate}: {exc}\n"
            "To exercise the harness alone: --candidate torch.utils.data:DataLoader",
            file=sys.stderr,
        )
        return 2
    baseline_cls = load_class(args.baseline)

    shape = (3, 224, 224)
    dataset = SyntheticImageDataset(args.batches * args.batch_size, shape)
    kwargs: dict[str, Any] = {"batch_size": args.batch_size, "num_workers": args.workers, "shuffle": False}
    if args.prefetch_factor is not None:
        kwargs["prefetch_factor"] = args.prefetch_factor
    base_name = "DataLoader" if args.baseline.endswith(":DataLoader") else args.baseline.rpartition(":")[2]
    cand_name = args.candidate.rpartition(":")[2]
    if cand_name == base_name:
        cand_name += "(cand)"
    factories = {
        base_name: lambda: baseline_cls(dataset, **kwargs),
        cand_name: lambda: candidate_cls(dataset, **kwargs),
    }
    for name, factory in factories.items():
        check_batches(name, factory, args.batch_size, shape)

    env = describe_environment(num_workers=args.workers)
    print(
        f"transport: {len(dataset)} samples of {'x'.join(map(str, shape))} uint8 "
        f"({format_bytes(dataset.sample_bytes)} each), batch {args.batch_size}, num_workers={args.workers}, "
        f"{args.batches} batches/round, {args.rounds} rounds (+{args.warmup} warm-up), alternating, "
        f"consume={args.consume}",
        flush=True,
    )
    result = compare(
        factories,
        num_batches=args.batches,
        num_rounds=args.rounds,
        num_warmup_rounds=args.warmup,
        baseline=base_name,
        consume=CONSUMERS[args.consume],
        environment=env,
    )
    print(result.format_table())
    speedup = result.ratio(cand_name)
    mem = result.memory_ratio(cand_name)
    footprint = result.footprint_ratio(cand_name)
    paired = ", ".join(f"{r:.2f}" for r in result.paired_ratios(cand_name))
    print(
        f"\n{cand_name} / {base_name}: {speedup:.2f}x batches/s (per round: {paired}); "
        f"peak PSS {mem:.2f}x; peak footprint {footprint:.2f}x"
    )
    fast = speedup >= GOAL_SPEEDUP
    ok = fast and mem <= 1.0
    print(
        f"goal (>= {GOAL_SPEEDUP}x batches/s at <= 1.00x memory): speed {'met' if fast else 'NOT met'}; "
        f"memory by peak PSS {'met' if mem <= 1.0 else 'NOT met'}, "
        f"by peak footprint {'met' if footprint <= 1.0 else 'NOT met'}"
    )
    print("\nenvironment:")
    for key, value in env.items():
        print(f"  {key}: {value}")
    if args.json:
        payload = {"benchmark": "transport", "args": vars(args), "goal_met": ok,
                   "goal_met_by_footprint": fast and footprint <= 1.0, **result.to_dict()}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
