"""A/B of cached epochs between checkouts, interleaved epoch by epoch.

    python -m benchmarks.cache_epochs_ab ROOT CHECKOUT_A CHECKOUT_B [--rounds 30] [--hold]
        [--outputs uint8]

On a shared host the load drifts within seconds, so whole runs of ``cache_epochs.py`` one after
the other compare different conditions. Here one process per checkout (``PYTHONPATH=CHECKOUT``)
builds the loader of ``cache_epochs.py`` (eval transform, batch 64, 2 workers, the whole set
cached, ``persistent_workers=False``), runs its cold epoch, and then the processes take turns:
one cached epoch each per round (the order alternating), each after its own memcpy reference.
Reports per checkout the median and quartiles of the per-epoch batch-bytes/memcpy ratios and the
median main-process CPU per batch. ``--hold``: each batch held until the next arrives.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where the benchmarks package lies


def child(root: str, hold: bool, output: str, memcpy_bytes: int) -> None:
    """One checkout's side: a cold epoch, then one cached epoch per "go" line on stdin."""
    import gpufeed
    from benchmarks.cache_epochs import OUTPUTS, memcpy_bytes_per_s, run_epoch
    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop

    dataset = ImageFolder(root, transform=ResizeCenterCrop(224, 256))
    loader = FastLoader(dataset, batch_size=64, num_workers=2, cache_bytes="60%", seed=0, **OUTPUTS[output])
    run_epoch(loader, hold)
    print("ready", gpufeed.__file__, flush=True)
    for line in sys.stdin:
        if line.strip() != "go":
            break
        bw = memcpy_bytes_per_s(memcpy_bytes)
        wall, cpu, batches, nbytes = run_epoch(loader, hold)
        print(f"{nbytes / wall / bw:.4f} {cpu / batches * 1e3:.4f}", flush=True)
    loader.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("checkouts", nargs=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--outputs", default="uint8", choices=["uint8", "float32"])
    parser.add_argument("--memcpy-mb", type=int, default=256,
                        help="buffer of the memcpy reference (MiB; larger than the last-level cache)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.root, args.hold, args.outputs, args.memcpy_mb << 20)
        return
    procs = []
    empty_dir = tempfile.TemporaryDirectory(prefix="gpufeed-ab-")
    empty = empty_dir.name
    for checkout in args.checkouts:
        cmd = [sys.executable, "-m", "benchmarks.cache_epochs_ab", os.path.abspath(args.root),
               *args.checkouts, "--child", "--outputs", args.outputs, "--memcpy-mb", str(args.memcpy_mb),
               ] + (["--hold"] if args.hold else [])
        # gpufeed from the checkout (first on the path), the benchmarks package from the
        # checkout too if it has one, else from here; the child runs in an empty directory so
        # that the working directory's gpufeed does not come first.
        path = os.pathsep.join([os.path.abspath(checkout), REPO])
        proc = subprocess.Popen(cmd, env=dict(os.environ, PYTHONPATH=path), stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, cwd=empty)
        assert proc.stdin is not None and proc.stdout is not None
        sys.stdout.write(f"{checkout}: {proc.stdout.readline().strip()}\n")
        procs.append(proc)
    shares: list[list[float]] = [[], []]
    cpus: list[list[float]] = [[], []]
    for r in range(args.rounds):
        for k in ((0, 1) if r % 2 == 0 else (1, 0)):
            proc = procs[k]
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
            share, cpu = map(float, proc.stdout.readline().split())
            shares[k].append(share)
            cpus[k].append(cpu)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    empty_dir.cleanup()
    mode = "held" if args.hold else "released"
    for k, checkout in enumerate(args.checkouts):
        q = statistics.quantiles(shares[k], n=4)
        sys.stdout.write(
            f"{checkout} ({args.outputs}, batch {mode} before the next): batch bytes / memcpy median "
            f"{statistics.median(shares[k]):.0%} (quartiles {q[0]:.0%}-{q[2]:.0%}, {args.rounds} epochs), "
            f"main-process CPU per batch median {statistics.median(cpus[k]):.2f} ms\n")


if __name__ == "__main__":
    main()
