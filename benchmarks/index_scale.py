"""Million-sample indexes: indexing seconds, bytes per sample, worker memory growth.

    python -m benchmarks.index_scale [--tree-files 100000] [--classes 1000] [--list 1000000]
                                     [--rounds 3] [--tmp-dir DIR] [--skip-tree] [--skip-list]

Tree part: builds a synthetic ImageFolder tree of ``--tree-files`` empty ``.JPEG`` files (up to
2M; creating them takes a while and is timed separately) under ``--tmp-dir``, then times, in
alternating rounds (median reported): the sequential scan (``gpufeed.sources._folder.scan``,
torchvision's ``make_dataset`` algorithm), the parallel scan at 1 and 16 threads, and
``ImageFolder`` without a cache, writing its index cache (a miss), and reading it (a hit, with
either check). The file system's dentry and inode caches stay warm, the best case for
scanning; ``--drop-caches`` (root) also times cold scans, each after dropping those caches,
where ``scandir`` waits on the disk and threads overlap the waits.

List part: ``--list`` torchvision-style ``(path, label)`` pairs with ImageNet-length paths.
Reports the parent's bytes per sample (USS growth from building, with freed heap trimmed), the
growth of one worker's USS over a full pass that reads every path and label (no decoding), and
the bytes pickled for a spawn/forkserver worker, for: torch's DataLoader over the list (the
copy-on-access failure: refcount writes dirty every page the list's objects live on), and
FastLoader over ``ImageDataset(pairs)``.

Pack part (``--pack N``): ``gpufeed pack`` of N real JPEGs with 1 thread and
``--pack-workers`` threads, storing the bytes or re-encoding them, and random-order reads of
every sample from the folder and from the packed LMDB.

Private import: ``gpufeed.sources._scan.scan_parallel``, the parallel scan it times.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.reduction import ForkingPickler
from typing import Any

import psutil
import torch
from torch.utils.data import DataLoader, Dataset

import gpufeed
from gpufeed import FastLoader
from gpufeed.sources import IMG_EXTENSIONS, ImageDataset, ImageFolder
from gpufeed.sources._folder import find_classes, scan
from gpufeed.sources._scan import scan_parallel

NUM_CHUNKS = 50


def uss() -> int:
    return int(psutil.Process().memory_full_info().uss)


def trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# -- tree ---------------------------------------------------------------------------------------


def make_tree(root: str, files: int, classes: int) -> float:
    """``files`` empty files in ``classes`` class folders, ImageNet-style names; seconds."""
    start = time.perf_counter()
    per_class = -(-files // classes)
    made = 0
    for c in range(classes):
        name = f"n{c:08d}"
        folder = os.path.join(root, name)
        os.mkdir(folder)
        for j in range(min(per_class, files - made)):
            os.close(os.open(os.path.join(folder, f"{name}_{j}.JPEG"), os.O_CREAT | os.O_WRONLY, 0o644))
        made += min(per_class, files - made)
    return time.perf_counter() - start


def tree_part(args: argparse.Namespace) -> None:
    base = tempfile.mkdtemp(prefix="gpufeed-index-bench-", dir=args.tmp_dir)
    root = os.path.join(base, "train")
    cache = os.path.join(base, "index.npz")
    os.mkdir(root)
    try:
        made_s = make_tree(root, args.tree_files, args.classes)
        made_at = time.perf_counter()
        _, class_to_idx = find_classes(root)
        n = len(scan(root, class_to_idx)[0])
        methods: dict[str, Callable[[], Any]] = {
            "sequential scan (torchvision's algorithm)": lambda: scan(root, class_to_idx),
            "parallel scan, 1 thread": lambda: scan_parallel(root, class_to_idx, IMG_EXTENSIONS, threads=1),
            "parallel scan, 16 threads": lambda: scan_parallel(root, class_to_idx, IMG_EXTENSIONS, threads=16),
            "ImageFolder, no index cache": lambda: ImageFolder(root),
            "ImageFolder, cache miss (scan, write)": lambda: (_remove(cache), ImageFolder(root, index_cache=cache)),
            "ImageFolder, cache hit, check directories": lambda: ImageFolder(root, index_cache=cache),
            "ImageFolder, cache hit, check files (stat all)": lambda: ImageFolder(
                root, index_cache=files_cache, index_check="files"),
        }
        times: dict[str, list[float]] = {k: [] for k in methods}
        files_cache = os.path.join(base, "index-files.npz")
        # warm-up, uncounted; past the 2 s window in which recently modified directories are
        # listed again, the directories cache is rewritten once and then only stats them
        ImageFolder(root, index_cache=files_cache, index_check="files")
        time.sleep(max(0.0, 2.5 - (time.perf_counter() - made_at)))
        ImageFolder(root, index_cache=cache)
        ImageFolder(root, index_cache=cache)
        for _ in range(args.rounds):
            for name, fn in methods.items():
                gc.collect()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        if args.drop_caches:
            cold = {k: [] for k in (
                "sequential scan (torchvision's algorithm)", "parallel scan, 1 thread",
                "parallel scan, 16 threads", "ImageFolder, cache hit, check directories")}
            for _ in range(args.rounds):
                for name in cold:
                    drop_caches()
                    start = time.perf_counter()
                    methods[name]()
                    cold[name].append(time.perf_counter() - start)
            times.update({f"{k} [cold]": v for k, v in cold.items()})
        cache_mb = os.path.getsize(cache) / 1e6
        print(f"\nindex of a tree of {n} files in {args.classes} classes (created in {made_s:.1f} s; "
              f"warm dentry cache unless [cold]; median of {args.rounds} alternating rounds; "
              f"cache file {cache_mb:.1f} MB)")
        ref = statistics.median(times["sequential scan (torchvision's algorithm)"])
        print(f"  {'method':50s} {'seconds':>8s} {'min..max':>13s} {'us/file':>8s} {'speed x':>8s}")
        for name, ts in times.items():
            med = statistics.median(ts)
            print(f"  {name:50s} {med:8.3f} {min(ts):6.3f}..{max(ts):<6.3f} {med / n * 1e6:8.2f} {ref / med:8.2f}")
    finally:
        start = time.perf_counter()
        shutil.rmtree(base, ignore_errors=True)
        print(f"  (tree removed in {time.perf_counter() - start:.1f} s)")


def drop_caches() -> None:
    """Empty the kernel's dentry and inode caches (root only): the next scan reads the disk."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.unlink(path)


# -- list ---------------------------------------------------------------------------------------


def imagenet_like_pairs(n: int) -> list[tuple[str, int]]:
    return [(f"/data/imagenet/train/n{i % 1000:08d}/n{i % 1000:08d}_{i:010d}.JPEG", i % 1000)
            for i in range(n)]


class TouchEverything(Dataset):
    """Item k reads the path and label of every sample of chunk k; returns (USS before, USS
    after) of the worker, in bytes."""

    def __init__(self, samples: Any) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return NUM_CHUNKS

    def __getitem__(self, k: int) -> torch.Tensor:
        n = len(self.samples)
        lo, hi = k * n // NUM_CHUNKS, (k + 1) * n // NUM_CHUNKS
        before = uss()
        total = 0
        if isinstance(self.samples, list):
            for i in range(lo, hi):
                path, label = self.samples[i]
                total += len(path) + label
        else:
            for i in range(lo, hi):
                total += len(self.samples.describe(i)) + self.samples.label(i)
        return torch.tensor([before, uss(), total])


def worker_growth(make_loader: Callable[[TouchEverything], Any], samples: Any) -> tuple[float, int]:
    """(seconds, USS growth in bytes) of one worker's full pass over ``samples``."""
    start = time.perf_counter()
    rows = torch.stack(list(make_loader(TouchEverything(samples)))).tolist()
    return time.perf_counter() - start, max(r[1] for r in rows) - rows[0][0]


def list_part(args: argparse.Namespace) -> None:
    n = args.list
    trim()
    before = uss()
    start = time.perf_counter()
    pairs = imagenet_like_pairs(n)
    list_s = time.perf_counter() - start
    trim()
    list_bytes = uss() - before
    path_bytes = sum(len(p) for p, _ in pairs)
    before = uss()
    start = time.perf_counter()
    ds = ImageDataset(pairs)
    table_s = time.perf_counter() - start
    trim()
    table_bytes = uss() - before

    def torch_loader(d: Dataset) -> DataLoader:
        return DataLoader(d, batch_size=None, num_workers=1, multiprocessing_context="fork")

    def fast_loader(d: Dataset) -> FastLoader:
        return FastLoader(d, batch_size=None, num_workers=1, multiprocessing_context="fork")

    rows = []
    for name, loader, samples, parent, build_s in (
        ("DataLoader, list of (path, label)", torch_loader, pairs, list_bytes, list_s),
        ("FastLoader, list of (path, label)", fast_loader, pairs, list_bytes, list_s),
        ("DataLoader, ImageDataset (tables)", torch_loader, ds, table_bytes, table_s),
        ("FastLoader, ImageDataset (tables)", fast_loader, ds, table_bytes, table_s),
    ):
        pass_s, growth = worker_growth(loader, samples)
        spawn_bytes = len(ForkingPickler.dumps(samples))
        if samples is ds:
            pickle.loads(ForkingPickler.dumps(samples))  # (collects the handles' descriptors)
        rows.append((name, build_s, parent / n, growth, pass_s, spawn_bytes))
    print(f"\n{n} torchvision-style samples ({path_bytes / n:.0f}-byte paths), one fork worker "
          f"reading every path and label (no decoding)")
    print(f"  {'loader, samples':36s} {'build s':>8s} {'parent B/sample':>16s} "
          f"{'worker USS growth':>18s} {'x list':>7s} {'pass s':>7s} {'pickled for spawn':>18s}")
    ref = rows[0][3]
    for name, build_s, per, growth, pass_s, spawn_bytes in rows:
        print(f"  {name:36s} {build_s:8.2f} {per:16.1f} {growth / 2**20:14.2f} MiB "
              f"{growth / ref:7.3f} {pass_s:7.2f} {spawn_bytes / 2**20:14.2f} MiB")
    print(f"  goals: worker USS growth < 10 MiB -> {rows[-1][3] / 2**20:.2f} MiB; parent < 100 B/sample "
          f"+ path bytes ({100 + path_bytes / n:.0f}) -> {rows[-1][2]:.1f}; pickled for a worker < 64 KiB "
          f"-> {rows[-1][5]} B")
    del ds, pairs


# -- pack ---------------------------------------------------------------------------------------


def pack_part(args: argparse.Namespace) -> None:
    """Pack throughput (1 thread vs ``--pack-workers``, stored vs re-encoded) and random-order
    read throughput of the packed LMDB against the folder, in alternating rounds."""
    import random

    from gpufeed.sources import LMDBDataset, pack
    from gpufeed.synth import make_image_folder

    base = tempfile.mkdtemp(prefix="gpufeed-pack-bench-", dir=args.tmp_dir)
    try:
        src = os.path.join(base, "src")
        per_class = -(-args.pack // 10)
        make_image_folder(src, num_classes=10, per_class=per_class, size=((180, 400), (180, 500)))
        folder = ImageFolder(src)
        n = len(folder)
        mb = sum(os.path.getsize(folder.path(i)) for i in range(n)) / 1e6
        runs: dict[str, list[float]] = {}
        k = 0
        for _ in range(args.rounds):
            for workers in (1, args.pack_workers):
                for quality in (None, 90):
                    k += 1
                    start = time.perf_counter()
                    pack(src, os.path.join(base, f"p{k}.lmdb"), progress=False, workers=workers,
                         quality=quality)
                    name = f"pack, {workers} thread(s), {'re-encode q90' if quality else 'store'}"
                    runs.setdefault(name, []).append(time.perf_counter() - start)
                    if k > 1:
                        shutil.rmtree(os.path.join(base, f"p{k}.lmdb"))
        packed = LMDBDataset(os.path.join(base, "p1.lmdb"))
        order = list(range(n))
        random.Random(0).shuffle(order)
        reads: dict[str, list[float]] = {"read folder (files)": [], "read packed (LMDB)": []}
        for _ in range(args.rounds):
            for name, ds in (("read folder (files)", folder), ("read packed (LMDB)", packed)):
                start = time.perf_counter()
                for i in order:
                    ds.read(i)
                reads[name].append(time.perf_counter() - start)
        print(f"\npack: {n} JPEGs, {mb:.1f} MB (180-400 x 180-500 px), median of {args.rounds} "
              f"alternating rounds")
        ref = statistics.median(next(iter(runs.values())))
        print(f"  {'what':40s} {'seconds':>8s} {'images/s':>9s} {'MB/s':>7s} {'speed x':>8s}")
        for name, ts in runs.items():
            med = statistics.median(ts)
            print(f"  {name:40s} {med:8.2f} {n / med:9.0f} {mb / med:7.1f} {ref / med:8.2f}")
        ref = statistics.median(reads["read folder (files)"])
        print("  random-order reads, warm page cache:")
        for name, ts in reads.items():
            med = statistics.median(ts)
            print(f"  {name:40s} {med:8.3f} {n / med:9.0f} {mb / med:7.1f} {ref / med:8.2f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree-files", type=int, default=100_000, help="files in the synthetic tree (<= 2M)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--list", type=int, default=1_000_000, help="entries of the in-memory list (<= 2M)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tmp-dir", default=None, help="where the tree is built (default: the temp dir)")
    p.add_argument("--drop-caches", action="store_true",
                   help="also time cold scans, dropping the dentry/inode caches first (root; "
                        "slows every other process on the machine for a moment)")
    p.add_argument("--pack", type=int, default=0, metavar="N",
                   help="also time `gpufeed pack` and reads from its LMDB on N real JPEGs")
    p.add_argument("--pack-workers", type=int, default=8)
    p.add_argument("--skip-tree", action="store_true")
    p.add_argument("--skip-list", action="store_true")
    args = p.parse_args()
    if not 0 < args.tree_files <= 2_000_000 or not 0 < args.list <= 2_000_000:
        p.error("--tree-files and --list must be in 1..2000000")
    print(f"gpufeed {gpufeed.__version__}, torch {torch.__version__}, Python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs")
    if not args.skip_tree:
        tree_part(args)
    if not args.skip_list:
        list_part(args)
    if args.pack:
        pack_part(args)


if __name__ == "__main__":
    main()
