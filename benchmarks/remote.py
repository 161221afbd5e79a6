"""Remote storage: ImageFolder over HTTP (a local server with injected latency) vs local disk.

A synthetic image tree (``gpufeed.synth``, photo-like JPEGs) is served on 127.0.0.1 by the
test suite's ``FileServer`` (tests/_http_server.py: standard-library directory listings,
HTTP/1.1 keep-alive, ``--delay-ms`` of sleep per request, as an object store's first byte).
In one run and alternating rounds (``gpufeed.compare._compare``): FastLoader over the tree on
local disk at each ``--local-concurrency``, then over ``http://127.0.0.1:PORT/`` at each
``--concurrency`` (the dataset's ``read_concurrency``), all at the same ``num_workers``.
Reported: images/s, the ratio to local disk at one read in flight and at the same
concurrency, peak PSS, and the requests the server answered (no failures injected).

Local disk is measured at 16 reads in flight too because on a host whose cores are oversubscribed
the read threads change how much CPU a worker's decode gets (its main thread waits on them and
is woken with the scheduler's sleeper credit): there, local disk with 16 read threads ran up to
2x local disk with one, so "HTTP vs local disk" is only fair at the same concurrency.

    python -m benchmarks.remote [--delay-ms 30] [--concurrency 1 4 16] [--local-concurrency 1 16]
                                [--workers 2] [--batches 8] [--rounds 3] [--images 512]

Needs ``pip install gpufeed[remote]`` (fsspec, aiohttp). The server runs in this process, so
its threads share the cores with the loader's main process (as a nearby server's would not).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop
from gpufeed.compare import compare, format_bytes
from gpufeed.synth import make_image_folder
from tests._http_server import FileServer  # the repository's test HTTP server (run from its root)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--delay-ms", type=float, default=30.0, help="server delay per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--local-concurrency", type=int, nargs="+", default=[1, 16])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--batches", type=int, default=8, help="batches per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--images", type=int, default=512)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpufeed-remote-bench-") as tmp:
        classes = 8
        make_image_folder(tmp, num_classes=classes, per_class=max(1, args.images // classes),
                          size=((300, 400), (350, 450)), seed=0)
        with FileServer(tmp, delay_s=args.delay_ms / 1e3, keep_alive=True) as server:
            return _run(args, Path(tmp), server)


def _run(args: argparse.Namespace, root: Path, server: FileServer) -> int:
    transform = RandomResizedCrop(224, seed=0)
    kw = dict(batch_size=args.batch_size, num_workers=args.workers, shuffle=True,
              persistent_workers=args.workers > 0)
    sizes = [p.stat().st_size for p in root.rglob("*.jpg")]
    print(f"{len(sizes)} JPEGs of ~300-400 x 350-450 ({sum(sizes) / len(sizes) / 1e3:.0f} KB "
          f"mean), batch {args.batch_size}, num_workers={args.workers}, train transform 224, "
          f"server delay {args.delay_ms:g} ms per request ({server.url})")
    factories = {}
    for c in args.local_concurrency:
        local = ImageFolder(root, transform, read_concurrency=c)
        factories[f"local rc={c}"] = lambda ds=local: FastLoader(ds, **kw)
    for c in args.concurrency:
        ds = ImageFolder(server.url, transform, read_concurrency=c)
        factories[f"http rc={c}"] = lambda ds=ds: FastLoader(ds, **kw)
    server.reset_counts()
    first = next(iter(factories))
    result = compare(factories, num_batches=args.batches, num_rounds=args.rounds, baseline=first)
    base = result.summary(first)
    for name in factories:
        s = result.summary(name)
        rate = s.median_batches_per_s * args.batch_size
        same = name.replace("http", "local")
        vs_same = (f", {result.ratio(name) / result.ratio(same):5.2f}x {same}"
                   if name.startswith("http") and same in factories else "")
        print(f"{name:12s} {rate:7.0f} img/s  {result.ratio(name):5.2f}x {first}{vs_same}  peak PSS "
              f"{format_bytes(s.peak_pss_bytes)} ({s.peak_pss_bytes / max(base.peak_pss_bytes, 1):.2f}x)")
    gets = server.file_gets()
    print(f"server: {sum(gets.values())} image requests for {len(gets)} files, "
          f"{sum(server.failed.values())} failed, at most {server.max_active} at once")
    return 0


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
