"""A/B of the image path's throughput between two checkouts, epoch by epoch, alternating.

    python -m benchmarks.checkout_ab ROOT CHECKOUT_A CHECKOUT_B [--rounds 8]
        [--transform eval|train] [--workers 2] [--batch-size 64]

Whether a change that should not touch speed (a move of code, a refactor) left it alone. One
process per checkout (``PYTHONPATH=CHECKOUT``) builds ``FastLoader(ImageFolder(ROOT,
transform=...), batch_size, num_workers, persistent_workers=True)`` through public names only,
so any two checkouts compare, and runs one epoch to warm the page cache and the workers; then the
processes take turns, one timed epoch each per round, the order alternating. Reports images/s
per checkout (median and quartiles), the ratio B / A of the medians and the median of the
per-round ratios. ``eval``: ``ResizeCenterCrop(224, 256)``; ``train``: ``RandomResizedCrop(224)``
(crop and flip drawn per epoch). Without ROOT's images, ``--make N`` writes N photo-like JPEGs
(~400x350) there first.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time


def child(root: str, transform: str, workers: int, batch_size: int) -> None:
    """One checkout's side: a warm-up epoch, then one timed epoch per "go" line on stdin."""
    import gpufeed
    from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop

    geometry = ResizeCenterCrop(224, 256) if transform == "eval" else RandomResizedCrop(224)
    loader = FastLoader(ImageFolder(root, transform=geometry), batch_size=batch_size, shuffle=transform == "train",
                        num_workers=workers, persistent_workers=True, seed=0)
    for _ in loader:
        pass
    print("ready", gpufeed.__file__, flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        images = 0
        start = time.perf_counter()
        for batch, _labels in loader:
            images += len(batch)
        print(f"{images / (time.perf_counter() - start):.3f}", flush=True)
    loader.close()


def _start(args: argparse.Namespace, checkout: str, cwd: str) -> subprocess.Popen:
    cmd = [sys.executable, os.path.abspath(__file__), os.path.abspath(args.root), *args.checkouts,
           "--child", "--transform", args.transform, "--workers", str(args.workers),
           "--batch-size", str(args.batch_size)]
    # gpufeed from the checkout alone (the child imports nothing else of a checkout, and runs this
    # file as a script, in an empty directory, so that no other gpufeed comes first).
    return subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=os.path.abspath(checkout)), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=cwd)


def _turn(proc: subprocess.Popen) -> float:
    """One timed epoch of ``proc``; images/s."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write("go\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"the child for {proc.args} ended (exit status {proc.wait(timeout=60)})")
    return float(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("checkouts", nargs=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--transform", default="eval", choices=["eval", "train"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--make", type=int, default=0, help="write this many photo-like JPEGs into ROOT first")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.root, args.transform, args.workers, args.batch_size)
        return
    if args.make:
        from gpufeed.synth import make_image_folder

        make_image_folder(args.root, num_classes=10, per_class=-(-args.make // 10), size=((300, 400), (350, 450)))
    with tempfile.TemporaryDirectory(prefix="gpufeed-ab-") as empty:
        procs = []
        for checkout in args.checkouts:
            proc = _start(args, checkout, empty)
            assert proc.stdout is not None
            ready = proc.stdout.readline().strip()
            if not ready.startswith("ready"):
                raise RuntimeError(f"the child for {checkout} did not start (exit status {proc.wait(timeout=60)})")
            sys.stdout.write(f"{checkout}: {ready}\n")
            procs.append(proc)
        rates: list[list[float]] = [[], []]
        for r in range(args.rounds):
            for k in ((0, 1) if r % 2 == 0 else (1, 0)):
                rates[k].append(_turn(procs[k]))
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
    for k, checkout in enumerate(args.checkouts):
        q = statistics.quantiles(rates[k], n=4)
        sys.stdout.write(f"{checkout}: {statistics.median(rates[k]):.1f} images/s median "
                         f"(quartiles {q[0]:.1f}-{q[2]:.1f}, {args.rounds} epochs)\n")
    paired = statistics.median(b / a for a, b in zip(rates[0], rates[1]))
    sys.stdout.write(f"B / A ({args.transform}, {args.workers} workers, batch {args.batch_size}): "
                     f"{statistics.median(rates[1]) / statistics.median(rates[0]):.3f}x of the medians, "
                     f"{paired:.3f}x median per-round ratio\n")


if __name__ == "__main__":
    main()
