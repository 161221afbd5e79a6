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


if __name__ == "__main__":
    st = os.statvfs("/dev/shm")
    print(json.dumps({
        "shm_bytes": st.f_blocks * st.f_frsize,
        "fastloader": _run(FastLoader),
        "dataloader": _run(DataLoader),
    }))
