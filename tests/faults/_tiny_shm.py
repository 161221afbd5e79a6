"""Run inside a mount namespace whose /dev/shm is 64 MB: torch's DataLoader vs FastLoader on
80 MB batches, FastLoader's per-sample (detection) path on batches of 2 photos of 2200-2400 px
as float32 with their instance masks (over 100 MB a batch), and the shared host cache. Prints
one JSON line: what each did."""

from __future__ import annotations

import json
import os
import sys

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


def _detection(root: str) -> dict:
    """CocoDetection of 4 large photos through FastLoader (2 workers, ``tuple(zip(*b))``): the
    image bytes of each batch and its samples' indices."""
    import tempfile

    import torch

    from gpufeed._synth_coco import make_coco
    from gpufeed.image.detection import DetectionPipeline
    from gpufeed.sources import CocoDetection
    from tests.integration._detection import tuple_collate

    coco = make_coco(tempfile.mkdtemp(dir=root), 4, size=((2200, 2400), (2200, 2400)), seed=1,
                     empty_fraction=0.0)
    ds = CocoDetection(coco.root, coco.ann_file, transforms=DetectionPipeline(image_dtype=torch.float32),
                       target_keys=["boxes", "masks", "image_id"])
    loader = FastLoader(ds, batch_size=2, num_workers=2, collate_fn=tuple_collate)
    try:
        batches = [(sum(x.numel() * x.element_size() for x in images),
                    [ds.ids.index(t["image_id"]) for t in targets]) for images, targets in loader]
    except RuntimeError as exc:
        return {"ok": False, "error": str(exc)[-400:]}
    return {"ok": True, "image_bytes": [b[0] for b in batches], "indices": [b[1] for b in batches]}


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
        "detection": _detection(sys.argv[1]),
        "host_cache": _host_cache(),
        # last: the failed iterator's garbage joins torch's dead workers when it is collected
        # (5 s each), which would otherwise be timed into the next run
        "dataloader": _run(DataLoader),
    }))
