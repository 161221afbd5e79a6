"""Run inside a mount namespace whose /dev/shm is 64 MB: torch's DataLoader vs FastLoader on
80 MB batches. Prints one JSON line: what each loader did."""

from __future__ import annotations

import json
import os

from torch.utils.data import DataLoader

from gpufeed import FastLoader
from tests.faults._datasets import Big


def _run(cls) -> dict:
    loader = cls(Big(6, mb=40), batch_size=2, num_workers=2)
    try:
        sums = [int(b[:, 0, 0, 0].sum()) for b in loader]
    except RuntimeError as exc:
        return {"ok": False, "error": str(exc)[-400:]}
    return {"ok": True, "sums": sums}


def _host_cache() -> dict:
    """96 MB of rows in the host cache shared by two processes (a job key of their own)."""
    import multiprocessing as mp
    import uuid

    import numpy as np

    from gpufeed.cache._shared import SharedHostCache, fingerprint

    job, digest = f"tiny-shm-{uuid.uuid4().hex}", fingerprint(["tiny shm"])
    cache = SharedHostCache(job, 100 << 20, "100MiB")
    space = cache.namespace(digest, 96)
    for key in range(96):
        space.put(key, np.full(1 << 20, key, np.uint8))

    def read(queue) -> None:
        other = SharedHostCache(job, 100 << 20, "100MiB")
        rows = other.namespace(digest, 96).get_many(list(range(96)))
        queue.put(sum(int(row[-1]) for row in rows if row is not None))

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=read, args=(queue,))
    child.start()
    total = queue.get(timeout=60)
    child.join(30)
    cache.close()
    return {"sum": total, "bytes": cache.published_bytes}


if __name__ == "__main__":
    st = os.statvfs("/dev/shm")
    print(json.dumps({
        "shm_bytes": st.f_blocks * st.f_frsize,
        "fastloader": _run(FastLoader),
        "dataloader": _run(DataLoader),
        "host_cache": _host_cache(),
    }))
