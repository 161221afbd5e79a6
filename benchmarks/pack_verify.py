"""What the image check costs ``gpufeed pack``: packing with the check (the default) against
``--no-verify``, alternating, in one run on the same folder.

    PYTHONPATH=CHECKOUT python benchmarks/pack_verify.py [ROOT] [--images 600] [--rounds 3]
        [--workers N]

Without ROOT, a folder of ``--images`` photo-like JPEGs (~400x350, quality 90: the demo's
images, about ImageNet's size) is generated in a temporary directory. Each round packs the
folder twice into fresh LMDBs in the same temporary directory (page cache warm after the first
round), once with ``verify=True`` and once with ``verify=False``, in alternating order; the
report gives the median images/s of each and the median of the per-round ratios.

Measured (``PYTHONPATH=. python benchmarks/pack_verify.py --images 600 --rounds 5``; 2 CPU
cores shared with other work, PyTurboJPEG 1.8.3 on libjpeg-turbo 2.1.5, OpenCV 5.1.0, default
workers = 2): with the check 2156 images/s (1732-2369), ``--no-verify`` 4851 images/s
(4587-6556); per-round ratio with / without: median 0.43x (0.26-0.49). The check makes a pack
that stores JPEGs as they are about 2.3x slower (about 0.26 ms of CPU per image of this size:
the 1/8-scale decode, against a file read and a copy into the LMDB); packs that re-encode
(``--max-side``, ``--quality``) decode the images anyway and run no separate check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gpufeed.sources import pack  # noqa: E402
from gpufeed.synth import make_image_folder  # noqa: E402


def _one(root: str, work: str, verify: bool, workers: int | None) -> float:
    dst = os.path.join(work, f"v{int(verify)}.lmdb")
    shutil.rmtree(dst, ignore_errors=True)
    t0 = time.perf_counter()
    result = pack(root, dst, progress=False, verify=verify, workers=workers)
    seconds = time.perf_counter() - t0
    shutil.rmtree(dst, ignore_errors=True)
    return result.count / seconds


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
        ratios = []
        for r in range(args.rounds):
            order = (True, False) if r % 2 == 0 else (False, True)
            got = {v: _one(root, work, v, args.workers) for v in order}
            for v in order:
                rates[v].append(got[v])
            ratios.append(got[True] / got[False])
    print(f"pack {root}: {args.rounds} rounds, alternating, workers={args.workers or 'default'}")
    for v, name in ((True, "with the check (default)"), (False, "--no-verify")):
        print(f"  {name:<26} {statistics.median(rates[v]):7.0f} images/s "
              f"({', '.join(f'{x:.0f}' for x in rates[v])})")
    print(f"  ratio with / without: median {statistics.median(ratios):.2f}x "
          f"({min(ratios):.2f}-{max(ratios):.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
