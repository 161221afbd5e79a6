"""The engine calls its plug-in filler's ``teardown()`` once in each worker as it leaves its task
loop, so a filler releases what it made there itself (the image path: its read threads)."""

from __future__ import annotations

import multiprocessing
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from gpufeed._engine.context import EngineContext
from gpufeed._engine.engine import Engine
from gpufeed._engine.messages import Done
from gpufeed._engine.plugin import FillPlugin
from gpufeed._engine.worker import WorkerSpec
from gpufeed.config import EngineConfig
from gpufeed.image._fill import FillReport
from gpufeed.stats import Stats


@dataclass(frozen=True)
class MarkingFiller:
    """A filler that writes a batch's indices into its slot and, at ``teardown``, a file named
    ``teardown.PID`` in ``marks`` (one per call: a second call in a process fails)."""

    marks: str

    def setup(self) -> None:
        pass

    def teardown(self) -> None:
        with open(os.path.join(self.marks, f"teardown.{os.getpid()}"), "x"):
            pass

    def prefetch(self, dataset: Any, index: Any, extra: Any) -> None:
        return None

    def fill(self, dataset: Any, index: Any, extra: Any, writer: Any, prefetched: Any,
             more: Any) -> tuple[Any, FillReport]:
        out = writer.tensor((len(index),), torch.int64)
        out.copy_(torch.tensor([dataset[i] for i in index], dtype=torch.int64))
        return out, FillReport(kept=list(range(len(index))))


class MarkingPlugin(FillPlugin):
    """The parent half: nothing written at submission, nothing kept after."""

    def __init__(self, marks: str) -> None:
        self.filler = MarkingFiller(marks)

    @property
    def parent_binds(self) -> bool:
        return False

    def prepare(self, tag: Any, index: Any, slot: torch.Tensor, count: bool, found: Any = None) -> None:
        return None

    def absorb(self, index: Any, extra: Any, report: Any, slot: torch.Tensor) -> None:
        pass


class SquareInts(torch.utils.data.Dataset):
    """100 samples: the plain int i*i."""

    def __len__(self) -> int:
        return 100

    def __getitem__(self, i: int) -> int:
        return i * i


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_each_worker_tears_its_filler_down_once_on_exit(tmp_path, method):
    context = EngineContext(EngineConfig(max_batch_bytes=1 << 16), Stats(), plugin=MarkingPlugin(str(tmp_path)))
    engine = Engine(context, WorkerSpec(dataset=SquareInts()), num_workers=2,
                    mp_context=multiprocessing.get_context(method))
    pids = list(engine.pids)
    got: dict[int, list[int]] = {}
    try:
        records = {engine.submit([i, i + 1], worker_id=i % 2).idx: i for i in range(4)}
        while len(got) < len(records):
            for record, reply in engine.wait(timeout_s=60.0):
                assert isinstance(reply, Done), reply
                got[records[record.idx]] = engine.result(record, reply).tolist()
        assert not os.listdir(tmp_path)  # running workers have not torn down
    finally:
        engine.close()
        context.close()
    assert got == {i: [i * i, (i + 1) * (i + 1)] for i in range(4)}
    assert sorted(os.listdir(tmp_path)) == sorted(f"teardown.{pid}" for pid in pids)
