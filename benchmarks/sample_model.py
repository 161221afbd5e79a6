"""The figures behind docs/design/sample-model.md (several views per sample, targets, batch ops).

    PYTHONPATH=$PWD python -m benchmarks.sample_model [dct|views|targets|batchops|all]
        [--samples 10000] [--reps 30]

``dct``: for DINO's crops (2 x RandomResizedCrop(224, scale=(0.4, 1)) + 6 x
RandomResizedCrop(96, scale=(0.05, 0.4))), how often each DCT factor is the one the most
demanding view needs, and how often a local view is that view, for 500x375 and 4000x3000
sources (crop parameters only; nothing is decoded).
``views``: one thread, seconds per sample of the same eight views made from one decode at the
most demanding view's scale against one decode per view, and one 224 view alone (median of
``--reps`` interleaved runs over 16 photo-like JPEGs).
``targets``: parent-side costs of targets: default_collate of 64 ints / strings / dicts, and
pickling 64 per-sample targets as a completion message would carry them.
``batchops``: a 64 x 3 x 224 x 224 batch: uint8 -> normalized float32 alone, then a MixUp
blend as a second pass, and the blend fused into the normalize pass (chunks of 8 rows).
"""

from __future__ import annotations

import argparse
import collections
import pickle
import statistics
import time

import numpy as np
import torch

from gpufeed import RandomResizedCrop
from gpufeed.decoders import choose_factor, decode, min_size_for_scale, read_header
from gpufeed.image._resample import crop_resize
from gpufeed.synth import encode, photo_like

GLOBAL = RandomResizedCrop(224, scale=(0.4, 1.0))
LOCAL = RandomResizedCrop(96, scale=(0.05, 0.4))
VIEWS = (GLOBAL,) * 2 + (LOCAL,) * 6


def _boxes(header, seed: int, index: int) -> list[tuple[RandomResizedCrop, tuple]]:
    out = []
    for view, t in enumerate(VIEWS):
        # the design's per-view key: (seed, epoch, index, view); here the view folds into epoch
        p = t.params(seed, view, index, header.height, header.width)
        out.append((t, (p.top, p.left, p.height, p.width), p.flip))
    return out


def _scale(t, box) -> float:
    oh, ow = t.output_size
    return max(oh / box[2], ow / box[3])


def dct(samples: int) -> None:
    for h, w in ((375, 500), (1500, 2000), (3000, 4000)):
        header = read_header(encode(photo_like(h, w, seed=1), quality=90))
        factors: collections.Counter = collections.Counter()
        global_only: collections.Counter = collections.Counter()
        local_sets = 0
        for i in range(samples):
            boxes = _boxes(header, 0, i)
            scales = [_scale(t, b) for t, b, _ in boxes]
            top = max(scales)
            local_sets += scales.index(top) >= 2
            need = min_size_for_scale(header, min(top, 1.0))
            factors[choose_factor(header, *need)] += 1
            g = max(scales[:2])
            global_only[choose_factor(header, *min_size_for_scale(header, min(g, 1.0)))] += 1

        def fmt(c: collections.Counter) -> str:
            return ", ".join(f"{a}/{b}: {100 * n / samples:.1f}%" for (a, b), n in sorted(c.items()))

        print(f"{w}x{h}: local view most demanding in {100 * local_sets / samples:.1f}% of samples")
        print(f"  factor for all views: {fmt(factors)}")
        print(f"  factor the 224 views alone would need: {fmt(global_only)}")


def _median_s(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def views(reps: int) -> None:
    import cv2

    cv2.setNumThreads(1)
    torch.set_num_threads(1)
    for h, w in ((375, 500), (1500, 2000)):
        _views_at(h, w, reps)


def _views_at(h: int, w: int, reps: int) -> None:
    jpegs = [encode(photo_like(h, w, seed=s), quality=90) for s in range(16)]
    outs = [np.empty((*t.output_size, 3), np.uint8) for t in VIEWS]

    def once() -> None:
        for i, data in enumerate(jpegs):
            header = read_header(data)
            boxes = _boxes(header, 0, i)
            top = min(1.0, max(_scale(t, b) for t, b, _ in boxes))
            mh, mw = min_size_for_scale(header, top) if top < 1.0 else (None, None)
            img = decode(data, min_height=mh, min_width=mw, header=header)
            for (_t, box, flip), out in zip(boxes, outs):
                crop_resize(img, header.height, header.width, box, flip, out, "hwc", "auto")

    def per_view() -> None:
        for i, data in enumerate(jpegs):
            for view, (t, out) in enumerate(zip(VIEWS, outs)):
                t.apply(data, index=i, epoch=view, seed=0, out=out)

    def single() -> None:
        for i, data in enumerate(jpegs):
            GLOBAL.apply(data, index=i, epoch=0, seed=0, out=outs[0])

    results = {"one decode, 8 views": [], "one decode per view": [], "one 224 view": []}
    for _ in range(reps):  # interleaved
        for name, fn in zip(results, (once, per_view, single)):
            results[name].append(_median_s(fn, 1) / len(jpegs))
    print(f"{w}x{h}, per sample (ms):")
    for name, ts in results.items():
        print(f"  {name}: {1e3 * statistics.median(ts):.2f}")


def targets(reps: int) -> None:
    from torch.utils.data import default_collate

    n = 64
    cases = {
        "int": list(range(n)),
        "float": [float(i) for i in range(n)],
        "str": [f"caption number {i} of the batch" for i in range(n)],
        "dict(int, str)": [{"label": i, "name": f"n{i:08d}"} for i in range(n)],
        "tensor[1000]": [torch.zeros(1000) for _ in range(n)],
        "tuple(int, dict)": [(i, {"a": float(i), "b": [i, i + 1]}) for i in range(n)],
    }
    for name, batch in cases.items():
        collate = _median_s(lambda b=batch: default_collate(b), reps)
        blob = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        trip = _median_s(lambda b=batch: pickle.loads(pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)), reps)
        print(f"  {name:18s} default_collate {1e6 * collate:7.1f} us   pickle round trip "
              f"{1e6 * trip:7.1f} us, {len(blob)} bytes")
    slot = torch.zeros(n * 8, dtype=torch.uint8)
    views_s = _median_s(lambda: [slot[8 * i: 8 * i + 8].view(torch.int64) for i in range(n)], reps)
    print(f"  64 per-sample views of a slot region: {1e6 * views_s:.1f} us")
    # A detection batch as a list collate leaves it: per sample an image view and a dict of
    # boxes (N x 4 float32) and labels (N int64), all views of one slot; the parent's cost is
    # the skeleton (pack_views here, as a worker's pack) and its unpickling into views (unpack).
    from gpufeed._engine.transport import pack_views, unpack

    lease = memoryview(bytearray(n * (3 * 64 * 64 + 20 * 24) + 4096))
    whole = torch.frombuffer(lease, dtype=torch.uint8)
    samples, off = [], 0
    for _ in range(n):
        img = whole[off: off + 3 * 64 * 64].view(3, 64, 64)
        off += 3 * 64 * 64
        boxes = whole[off: off + 320].view(torch.float32).view(20, 4)
        labels = whole[off + 320: off + 480].view(torch.int64)
        off += 480
        samples.append((img, {"boxes": boxes, "labels": labels}))
    batch = tuple(zip(*samples))
    skeleton = pack_views(batch, whole)[0]
    pack_s = _median_s(lambda: pack_views(batch, whole), reps)
    unpack_s = _median_s(lambda: unpack(skeleton, lease), reps)
    print(f"  detection list batch (64 x (image, boxes, labels)): skeleton {len(skeleton)} bytes, "
          f"pack {1e6 * pack_s:.0f} us, unpack {1e6 * unpack_s:.0f} us")


def batchops(reps: int) -> None:
    from gpufeed.image._normalize import affine, convert_

    torch.set_num_threads(1)
    n, lam = 64, 0.7
    x = torch.randint(0, 256, (n, 3, 224, 224), dtype=torch.uint8)
    out = torch.empty(x.shape, dtype=torch.float32)
    consts = affine(((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), torch.float32)
    scale, shift = consts

    def normalize_only() -> None:
        convert_(out, x, consts)

    def then_blend() -> None:
        convert_(out, x, consts)
        rolled = out.roll(1, 0)  # torchvision v2 MixUp pairs each row with the one before
        out.mul_(lam).add_(rolled, alpha=1 - lam)

    s_lam, s_rest = scale * lam, scale * (1 - lam)
    bufs = [torch.empty(x.shape[1:], dtype=torch.float32) for _ in range(2)]

    def fused() -> None:
        # one row at a time (L2-sized), each uint8 row converted once: row i's partner is row
        # i - 1 (v2 MixUp's roll(1)), converted in the step before; row 0's is row n - 1
        prev, cur = bufs
        prev.copy_(x[n - 1])
        for i in range(n):
            cur.copy_(x[i])
            o = out[i]
            torch.mul(cur, s_lam[0], out=o)
            o.addcmul_(prev, s_rest[0]).add_(shift[0])  # normalize(mix(a, b)): one affine
            prev, cur = cur, prev

    y0, y1, x0, x1 = 40, 152, 60, 172  # a CutMix box of 1/4 of the area

    def cutmix() -> None:
        patch = x[:, :, y0:y1, x0:x1].roll(1, 0)  # a copy: the source rows change below
        x[:, :, y0:y1, x0:x1] = patch
        convert_(out, x, consts)

    results = {"normalize": [], "normalize then blend": [], "blend fused": [],
               "cutmix paste on uint8 + normalize": []}
    for _ in range(reps):
        for name, fn in zip(results, (normalize_only, then_blend, fused, cutmix)):
            results[name].append(_median_s(fn, 1))
    for name, ts in results.items():
        print(f"  {name}: {1e3 * statistics.median(ts):.1f} ms per 64x3x224x224 batch")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", default="all", choices=("dct", "views", "targets", "batchops", "all"))
    parser.add_argument("--samples", type=int, default=10000)
    parser.add_argument("--reps", type=int, default=30)
    args = parser.parse_args()
    for name, fn in (("dct", lambda: dct(args.samples)), ("views", lambda: views(args.reps)),
                     ("targets", lambda: targets(args.reps)), ("batchops", lambda: batchops(args.reps))):
        if args.what in (name, "all"):
            print(f"== {name}")
            fn()


if __name__ == "__main__":
    main()
