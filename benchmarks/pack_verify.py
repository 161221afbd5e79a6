"""What the image check costs ``gpufeed pack``: packing with the check (the default) against
``--no-verify``, alternating, in one run on the same folder.

    PYTHONPATH=CHECKOUT python -m benchmarks.pack_verify [ROOT] [--images 600] [--rounds 3]
        [--workers N]

Without ROOT, a folder of ``--images`` photo-like JPEGs (~400x350, quality 90: the demo's
images, about ImageNet's size) is generated in a temporary directory. Each round packs the
folder twice into fresh LMDBs in the same temporary directory (page cache warm after the first
round), once with ``verify=True`` and once with ``verify=False``, in alternating order; the
report gives the median images/s of each and the median of the per-round ratios.

Measured (``PYTHONPATH=. python -m benchmarks.pack_verify --images 600 --rounds 5``; 2 CPU
cores shared with other work, load average 13-15; PyTurboJPEG 1.8.3 on libjpeg-turbo 2.1.5,
OpenCV 5.1.0, default workers = 2): with the check 420 images/s (368-589) and 0.59 ms of CPU
per image, ``--no-verify`` 1173 images/s (967-4154) and 0.16 ms; per-round ratio with /
without: median 0.39x (0.09-0.52). The check (a 1/8-scale greyscale decode) adds about 0.43 ms
of CPU per image of this size, 3.7x what the rest of such a pack costs, so a pack that stores
JPEGs as they are runs about 2.5x slower with it; packs that re-encode (``--max-side``,
``--quality``) decode the images anyway and run no separate check. Rates swing with the load
on a shared machine: compare the ratios and CPU figures, not the rates.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

from gpufeed.sources import pack
from gpufeed.synth import make_image_folder


def _one(root: str, work: str, verify: bool, workers: int | None) -> tuple[float, float]:
    """(images/s wall clock, CPU ms per image of this process, all its threads) of one pack."""
    dst = os.path.join(work, f"v{int(verify)}.lmdb")
    shutil.rmtree(dst, ignore_errors=True)
    t0, c0 = time.perf_counter(), time.process_time()
    result = pack(root, dst, progress=False, verify=verify, workers=workers)
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    shutil.rmtree(dst, ignore_errors=True)
    return result.count / seconds, 1e3 * cpu_s / result.count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", nargs="?", help="image folder (default: generated)")
    p.add_argument("--images", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpufeed-pack-verify-") as work:
        root = args.root
        if root is None:
            root = os.path.join(work, "src")
            make_image_folder(root, num_classes=10, per_class=max(1, args.images // 10),
                              size=((320, 380), (370, 430)), seed=0, quality=90)
        _one(root, work, True, args.workers)  # warm-up: page cache, imports, decoders
        rates: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        ratios = []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {v: _one(root, work, v, args.workers) for v in order}
            for v in order:
                rates[v].append(got[v][0])
                cpu[v].append(got[v][1])
            ratios.append(got[True][0] / got[False][0])
    print(f"pack {root}: {args.rounds} rounds, alternating, workers={args.workers or 'default'}")
    for v, name in ((True, "with the check (default)"), (False, "--no-verify")):
        print(f"  {name:<26} {statistics.median(rates[v]):7.0f} images/s "
              f"({', '.join(f'{x:.0f}' for x in rates[v])}); CPU "
              f"{statistics.median(cpu[v]):.2f} ms/image")
    print(f"  ratio with / without: median {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f}); the check's CPU: "
          f"{statistics.median(cpu[True]) - statistics.median(cpu[False]):.2f} ms/image")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
