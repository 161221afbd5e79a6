"""Tar shards: TarShards against ImageFolder through FastLoader, and webdataset's own pipeline.

One run, alternating rounds (``gpufeed.compare._compare``; each round starts one loader further
on, so that no loader always runs right after the same other one), the same photos as an image
folder and as tar shards written by ``gpufeed pack --format tar``, the same geometry (eval: resize 256,
centre crop 224; train: random resized crop 224 + flip), float32 NCHW normalized with ImageNet's
mean and std, batch 64, the same ``num_workers`` (default 2):

- ``TarShards``: ``FastLoader(TarShards(shards, transform))`` (the image fast path);
- ``ImageFolder``: ``FastLoader(ImageFolder(root, transform))`` on the same images;
- ``wds+PIL``: ``DataLoader(WebDataset(shards).decode("pil").to_tuple("jpg", "cls")
  .map_tuple(transform, int))``, the transform written with PIL (resize bilinear, crop,
  ``np.asarray``, normalize, CHW) as torchvision's would be;
- ``wds+cv2``: the same with ``cv2.imdecode`` (one OpenCV thread) instead of PIL.

With ``--latency-ms L`` (default 30) every TarShards read first sleeps L ms (an injected wait,
as ``benchmarks/latency.py`` does), at ``read_concurrency`` 64, in the same rounds as the local
rate it is compared with. Also reported: index build time (walk) and load time (index cache)
of these shards, and the time from ``iter()`` to the first batch of each loader (the TarShards
one at L ms with a cached index, the dataset constructed inside the timing).

``--index-scale N`` (default 0: off) instead generates N samples in N/1000 shards (real tar
headers, 16x16 JPEG image members, a ``.cls`` each), then reports the index build time, the
cached load time and the index bytes per sample, and the PSS of a 2-worker loader's workers
against the parent's (flat: the tables are shared, not copied).

    python -m benchmarks.tar_shards [--images 2000] [--shards 8] [--workers 2] [--batches 30]
                                    [--rounds 5] [--transform eval train] [--latency-ms 30]
    python -m benchmarks.tar_shards --index-scale 1000000 [--dir DIR]

Goals (2 cores, 2 workers, batch 64): TarShards >= 0.95x ImageFolder (eval and train),
>= 2.5x wds+cv2; at 30 ms per read, rc=64, >= 0.8x its own local rate; 1M samples in 1,000
shards indexed in < 60 s, loaded from the cache in < 2 s, <= 100 bytes per sample + key bytes;
first batch within 3 s of ``iter()`` at 30 ms with a cached index.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop, TarShards
from gpufeed.compare import compare
from gpufeed.compare._environment import describe_environment
from gpufeed.compare._images import IMAGENET_NORMALIZE, single_threaded_cv2
from gpufeed.sources import pack_tar
from gpufeed.synth import make_image_folder

MEAN = np.array(IMAGENET_NORMALIZE[0], np.float32) * 255
STD = np.array(IMAGENET_NORMALIZE[1], np.float32) * 255


class SlowTarShards(TarShards):
    """TarShards whose every read first waits ``latency_s`` (a blocking wait, GIL released)."""

    latency_s = 0.0

    def read(self, index: int) -> Any:
        time.sleep(self.latency_s)
        return super().read(index)


class WdsTransform:
    """webdataset's usual per-sample transform: the same boxes as gpufeed's transforms, then
    float32 normalized CHW (``decoder`` "pil": a PIL image in; "cv2": JPEG bytes in)."""

    def __init__(self, geometry: Any, decoder: str) -> None:
        self.geometry, self.decoder = geometry, decoder

    def __call__(self, sample: Any) -> torch.Tensor:
        key, image = sample
        if self.decoder == "cv2":
            bgr = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
            rgb = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
            out = self._geometry_cv2(rgb, int(key))
        else:
            out = self._geometry_pil(image.convert("RGB"), int(key))
        chw = ((out.astype(np.float32) - MEAN) / STD).transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(chw))

    def _box(self, index: int, h: int, w: int) -> tuple[int, int, int, int, bool, tuple[int, int]]:
        g = self.geometry
        oh, ow = g.output_size
        if isinstance(g, ResizeCenterCrop):
            nh, nw = g.resized_size(h, w)
            return -1, -1, nh, nw, False, (oh, ow)
        p = g.params(0, 0, index, h, w)
        return p.top, p.left, p.height, p.width, p.flip, (oh, ow)

    def _geometry_pil(self, img: Any, index: int) -> np.ndarray:
        from PIL import Image

        top, left, bh, bw, flip, (oh, ow) = self._box(index, img.height, img.width)
        if top < 0:
            img = img.resize((bw, bh), Image.Resampling.BILINEAR)
            t, lft = int(round((bh - oh) / 2)), int(round((bw - ow) / 2))
            img = img.crop((lft, t, lft + ow, t + oh))
        else:
            img = img.resize((ow, oh), Image.Resampling.BILINEAR, box=(left, top, left + bw, top + bh))
            if flip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(img)

    def _geometry_cv2(self, img: np.ndarray, index: int) -> np.ndarray:
        top, left, bh, bw, flip, (oh, ow) = self._box(index, *img.shape[:2])
        if top < 0:
            img = cv2.resize(img, (bw, bh), interpolation=cv2.INTER_AREA)
            t, lft = int(round((bh - oh) / 2)), int(round((bw - ow) / 2))
            return img[t:t + oh, lft:lft + ow]
        img = cv2.resize(img[top:top + bh, left:left + bw], (ow, oh), interpolation=cv2.INTER_AREA)
        return cv2.flip(img, 1) if flip else img


def wds_loader(shards: list[str], geometry: Any, decoder: str, batch_size: int,
               workers: int) -> DataLoader:
    import webdataset as wds

    pipe = wds.WebDataset(shards, shardshuffle=False, empty_check=False)
    pipe = pipe.decode("pil") if decoder == "pil" else pipe
    transform = WdsTransform(geometry, decoder)
    pipe = pipe.to_tuple("__key__", "jpg", "cls").map(
        lambda s: (transform((s[0], s[1])), int(s[2])))
    return DataLoader(pipe, batch_size=batch_size, num_workers=workers)


def prepare(directory: Path, images: int, shards: int) -> tuple[Path, list[str]]:
    root = directory / "folder"
    if not root.exists():
        make_image_folder(root, num_classes=10, per_class=images // 10, size=(350, 400), seed=0)
    out = directory / "shards"
    if not out.exists():
        total = sum(os.path.getsize(p) for p in root.rglob("*.jpg"))
        pack_tar(root, out, shard_bytes=int(total * 1.03 / shards), progress=False)
    return root, sorted(str(p) for p in out.glob("*.tar"))


def first_batch_s(make: Any) -> float:
    t0 = time.perf_counter()
    loader = make()
    next(iter(loader))
    seconds = time.perf_counter() - t0
    del loader
    return seconds


def loader_factories(kind: str, root: Path, shards: list[str],
                     args: argparse.Namespace) -> dict[str, Any]:
    """name -> a callable making a fresh loader, for transform ``kind`` ("eval"/"train")."""
    geometry = (ResizeCenterCrop(224, 256) if kind == "eval" else RandomResizedCrop(224, seed=0))
    kw = dict(batch_size=args.batch_size, num_workers=args.workers, shuffle=kind == "train",
              dtype=torch.float32, normalize=IMAGENET_NORMALIZE)
    tar = TarShards(shards, transform=geometry)
    slow = SlowTarShards(shards, transform=geometry, read_concurrency=64)
    slow.latency_s = args.latency_ms / 1e3
    folder = ImageFolder(root, transform=geometry)

    def fast(ds: Any) -> Any:
        return lambda: FastLoader(ds, **kw, generator=torch.Generator().manual_seed(0))

    return {
        "TarShards": fast(tar),
        "ImageFolder": fast(folder),
        f"TarShards {args.latency_ms:g} ms rc=64": fast(slow),
        "wds+PIL": lambda: wds_loader(shards, geometry, "pil", args.batch_size, args.workers),
        "wds+cv2": lambda: wds_loader(shards, geometry, "cv2", args.batch_size, args.workers),
    }


def run_loaders(args: argparse.Namespace) -> None:
    root, shards = prepare(Path(args.dir), args.images, args.shards)
    sizes = [os.path.getsize(s) for s in shards]
    print(f"{len(ImageFolder(root))} photos of 400x350, {len(shards)} shards of "
          f"{statistics.mean(sizes) / 1e6:.1f} MB, batch {args.batch_size}, "
          f"num_workers={args.workers}, float32 NCHW normalized, load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    t0 = time.perf_counter()
    TarShards(shards)
    walk_s = time.perf_counter() - t0
    cache = Path(args.dir) / "index-cache.npz"
    cache.unlink(missing_ok=True)
    TarShards(shards, index_cache=cache)
    t0 = time.perf_counter()
    TarShards(shards, index_cache=cache)
    print(f"index: built by walking the headers in {walk_s * 1e3:.0f} ms, loaded from the cache "
          f"in {(time.perf_counter() - t0) * 1e3:.0f} ms")
    kw = dict(batch_size=args.batch_size, num_workers=args.workers)
    out = dict(dtype=torch.float32, normalize=IMAGENET_NORMALIZE)
    for kind in args.transform:
        factories = loader_factories(kind, root, shards, args)
        result = compare(factories, num_batches=args.batches, num_rounds=args.rounds,
                         baseline="TarShards", rotate=True,
                         environment=describe_environment(args.workers))
        print(f"\n{kind}: images/s (median of {args.rounds} rounds) and TarShards' ratio to each "
              f"(median of the per-round ratios)")
        for name in factories:
            rate = result.summary(name).median_batches_per_s * args.batch_size
            paired = sorted(result.paired_ratios("TarShards", name)) if name != "TarShards" else []
            ratio = (f"  TarShards / this = {statistics.median(paired):.2f}x (rounds "
                     f"{', '.join(f'{r:.2f}' for r in paired)})" if paired else "")
            print(f"  {name:22s} {rate:7.0f} img/s{ratio}")
        slow_name = f"TarShards {args.latency_ms:g} ms rc=64"
        paired = sorted(result.paired_ratios(slow_name, "TarShards"))
        print(f"  {slow_name} / local TarShards = {statistics.median(paired):.2f}x")

    geometry = ResizeCenterCrop(224, 256)

    def slow_cached() -> FastLoader:
        ds = SlowTarShards(shards, transform=geometry, read_concurrency=64, index_cache=cache)
        ds.latency_s = args.latency_ms / 1e3
        return FastLoader(ds, **kw, **out)

    firsts = {
        f"TarShards {args.latency_ms:g} ms rc=64, cached index": slow_cached,
        "TarShards local": lambda: FastLoader(TarShards(shards, transform=geometry), **kw, **out),
        "ImageFolder local": lambda: FastLoader(ImageFolder(root, transform=geometry), **kw, **out),
        "wds+PIL local": lambda: wds_loader(shards, geometry, "pil", args.batch_size, args.workers),
        "wds+cv2 local": lambda: wds_loader(shards, geometry, "cv2", args.batch_size, args.workers),
    }
    print("\ntime to first batch (dataset construction included; median of 3):")
    for name, make in firsts.items():
        times = sorted(first_batch_s(make) for _ in range(3))
        print(f"  {name:40s} {times[1]:.2f} s")


def write_scale_shards(directory: Path, samples: int, per_shard: int = 1000) -> list[str]:
    """``samples`` samples in shards of ``per_shard``: a real ustar header per member (via a
    template and its checksum), a 512-byte image member and a ``.cls`` member each."""
    import tarfile

    def header(name: str, size: int) -> bytes:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, 0, 0o444
        return info.tobuf(format=tarfile.USTAR_FORMAT)

    image = cv2.imencode(".jpg", np.full((16, 16, 3), 128, np.uint8))[1].tobytes()
    padded = image.ljust(-(-len(image) // 512) * 512, b"\0")
    paths = []
    directory.mkdir(parents=True, exist_ok=True)
    for s in range(-(-samples // per_shard)):
        path = directory / f"scale-{s:06d}.tar"
        paths.append(str(path))
        if path.exists():
            continue
        parts = []
        for i in range(s * per_shard, min(samples, (s + 1) * per_shard)):
            label = str(i % 1000).encode()
            parts += [header(f"{i:09d}.jpg", len(image)), padded,
                      header(f"{i:09d}.cls", len(label)), label.ljust(512, b"\0")]
        parts.append(bytes(1024))
        path.write_bytes(b"".join(parts))
    return paths


def run_index_scale(args: argparse.Namespace) -> None:
    import psutil

    directory = Path(args.dir) / f"scale-{args.index_scale}"
    t0 = time.perf_counter()
    shards = write_scale_shards(directory, args.index_scale)
    print(f"{args.index_scale} samples in {len(shards)} shards ready in "
          f"{time.perf_counter() - t0:.1f} s ({sum(os.path.getsize(s) for s in shards) / 1e9:.2f} "
          f"GB, in the page cache), load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    cache = directory / "index-cache.npz"
    cache.unlink(missing_ok=True)
    t0 = time.perf_counter()
    ds = TarShards(shards, index_cache=cache)
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    ds = TarShards(shards, index_cache=cache)
    load_s = time.perf_counter() - t0
    key_bytes = ds._keys.blob.nbytes
    table = (ds._keys.offsets.nbytes + ds._offsets.nbytes + ds._sizes.nbytes + ds._exts.nbytes
             + ds._labels.nbytes + ds._starts.nbytes)
    print(f"index built in {build_s:.1f} s (walk + write the cache), loaded from the cache in "
          f"{load_s:.2f} s; {table / len(ds):.1f} bytes per sample + {key_bytes / len(ds):.1f} "
          f"key bytes")
    loader = FastLoader(TarShards(shards, transform=ResizeCenterCrop(8, 8), index_cache=cache),
                        batch_size=64, num_workers=2, persistent_workers=True, shuffle=True)
    it = iter(loader)
    for _ in range(20):
        next(it)
    me = psutil.Process()
    kids = me.children(recursive=True)

    def mb(p: Any, kind: str) -> str:
        return f"{getattr(p.memory_full_info(), kind) / 1e6:.0f}"

    print(f"memory with 2 workers: parent PSS {mb(me, 'pss')} MB (USS {mb(me, 'uss')}); "
          f"workers' PSS {', '.join(mb(k, 'pss') for k in kids)} MB (USS "
          f"{', '.join(mb(k, 'uss') for k in kids)}); index tables "
          f"{(table + key_bytes) / 1e6:.0f} MB, shared")
    del it, loader


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=os.path.join(tempfile.gettempdir(), "gpufeed-tar-bench"))
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=30, help="batches per round")
    p.add_argument("--rounds", type=int, default=5,
                   help="counted rounds, each starting one loader further on (with 5 loaders, "
                        "5 rounds put each loader once in every place)")
    p.add_argument("--transform", nargs="+", choices=("eval", "train"), default=["eval", "train"])
    p.add_argument("--latency-ms", type=float, default=30.0)
    p.add_argument("--index-scale", type=int, default=0, metavar="N")
    p.add_argument("--clean", action="store_true", help="delete --dir afterwards")
    args = p.parse_args(argv)
    with single_threaded_cv2():
        if args.index_scale:
            run_index_scale(args)
        else:
            run_loaders(args)
    if args.clean:
        shutil.rmtree(args.dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
