"""Large photos, one image at a time in one thread: what bounds FastLoader against
DataLoader+OpenCV ``IMREAD_REDUCED_*`` (the large-photo goal: >= 1.1x OpenCV reduced).

    python -m benchmarks.decode_large [ROOT] [--images 8] [--rounds 7] [--size 224 --resize 256]

Per image, median over ``--rounds`` rounds that alternate the pipelines (milliseconds):

* ``opencv reduced``: ``cv2.imdecode(..., IMREAD_REDUCED_COLOR_k)`` at the reduction DataLoader+OpenCV
  uses in ``large_photos.py`` (the largest that still covers the resize);
* ``turbojpeg scaled``: PyTurboJPEG's ``decode(scaling_factor=1/k)`` at the same k;
* ``turbojpeg planes``: ``decode_to_yuv_planes`` at 1/k (no chroma upsampling or colour conversion);
* ``gpufeed decode``: ``gpufeed.decode`` (its own reduction choice);
* ``gpufeed eval``: ``ResizeCenterCrop(size, resize).apply`` into a uint8 CHW array: the whole
  per-image work of a FastLoader worker for the eval transform.

The ratio ``opencv reduced / gpufeed eval`` bounds what FastLoader can gain over
DataLoader+OpenCV with the same number of worker processes: if the decoders cost the same, the
entropy decoding (the same for every libjpeg) sets the rate, and the rest of the pipeline is all
that is left to win. Without ROOT, ``--images`` photos like ``gpufeed demo --large``'s are made
once in ./demo-large-decode.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np


def reduction(height: int, width: int, resize: int) -> int:
    """The largest k in 8, 4, 2, 1 whose 1/k decode keeps the shorter side >= ``resize`` pixels."""
    return next(k for k in (8, 4, 2, 1) if min(-(-height // k), -(-width // k)) >= resize)


def main(argv: list[str] | None = None) -> int:
    import cv2
    from turbojpeg import TJPF_RGB

    from gpufeed.decoders import _backends, decode, read_header
    from gpufeed.image import ResizeCenterCrop
    from gpufeed.synth import LARGE_SIZE, make_image_folder

    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("root", nargs="?", help="folder of JPEGs (default: ./demo-large-decode, made once)")
    p.add_argument("--images", type=int, default=8)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--size", type=int, default=224, help="eval crop (pixels)")
    p.add_argument("--resize", type=int, default=256, help="eval shorter side before the crop (pixels)")
    args = p.parse_args(argv)
    root = Path(args.root or "demo-large-decode")
    if args.root is None and not root.exists():
        make_image_folder(root, num_classes=1, per_class=args.images, size=LARGE_SIZE, quality=95,
                          large=True, seed=5)
    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in (".jpg", ".jpeg"))[: args.images]
    if not files:
        print(f"no JPEG files under {root}", file=sys.stderr)
        return 2
    datas = [f.read_bytes() for f in files]
    cv2.setNumThreads(1)
    tj = _backends.turbo_state().decoder
    if tj is None:
        print("libturbojpeg is not loaded: nothing to compare (install libturbojpeg0)", file=sys.stderr)
        return 2
    ks = []
    for d in datas:
        h = read_header(d)
        ks.append(reduction(h.height, h.width, args.resize))
    flag = {1: cv2.IMREAD_COLOR, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
            8: cv2.IMREAD_REDUCED_COLOR_8}
    eval_transform = ResizeCenterCrop(size=args.size, resize=args.resize)
    out = np.empty((3, args.size, args.size), np.uint8)

    def each(fn: Callable[[bytes, int], object]) -> Callable[[], None]:
        def run() -> None:
            for d, k in zip(datas, ks):
                fn(d, k)
        return run

    pipelines: dict[str, Callable[[], None]] = {
        "opencv reduced": each(lambda d, k: cv2.imdecode(np.frombuffer(d, np.uint8), flag[k])),
        "turbojpeg scaled": each(lambda d, k: tj.decode(np.frombuffer(d, np.uint8), pixel_format=TJPF_RGB,
                                                        scaling_factor=None if k == 1 else (1, k))),
        "turbojpeg planes": each(lambda d, k: tj.decode_to_yuv_planes(
            np.frombuffer(d, np.uint8), scaling_factor=None if k == 1 else (1, k))),
        "gpufeed decode": each(lambda d, k: decode(d, min_height=args.resize, min_width=args.resize)),
        "gpufeed eval": each(lambda d, k: eval_transform.apply(d, out=out)),
    }
    times: dict[str, list[float]] = {name: [] for name in pipelines}
    for _ in range(args.rounds):
        for name, run in pipelines.items():
            t = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - t) / len(datas) * 1e3)
    sizes = [len(d) / 1e6 for d in datas]
    print(f"{len(datas)} JPEGs from {root}, {min(sizes):.1f}-{max(sizes):.1f} MB, reductions "
          f"{sorted(set(ks))}, {args.rounds} alternating rounds, one thread; "
          f"libturbojpeg {_backends.backends()['turbojpeg'].get('library')}, OpenCV {cv2.__version__}")
    base = statistics.median(times["opencv reduced"])
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:<17} {med:7.2f} ms/image (min {min(values):6.2f})  x opencv reduced: {med / base:.3f}")
    bound = base / statistics.median(times["gpufeed eval"])
    print(f"bound on FastLoader / DataLoader+OpenCV reduced, same workers (opencv reduced / gpufeed eval): "
          f"{bound:.2f}x (goal: >= 1.1x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
