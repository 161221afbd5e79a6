"""Comparing batches, and stopping an epoch part-way for its state: shared by the resume tests."""

from __future__ import annotations

import json
from typing import Any

import torch

from gpufeed import FastLoader


def leaves(batch: Any) -> list[torch.Tensor]:
    """Every tensor of a batch (a tensor, or lists, tuples and dicts of them), in order."""
    if isinstance(batch, dict):
        return [torch.as_tensor(batch[k]) for k in sorted(batch)]
    if isinstance(batch, (list, tuple)):
        return [t for part in batch for t in leaves(part)]
    return [torch.as_tensor(batch)]


def same(a: list[Any], b: list[Any]) -> bool:
    """Whether two lists of batches hold the same batches, tensor for tensor."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        lx, ly = leaves(x), leaves(y)
        if len(lx) != len(ly) or not all(torch.equal(p, q) for p, q in zip(lx, ly)):
            return False
    return True


def interrupted(loader: FastLoader, k: int) -> tuple[list[Any], dict[str, Any]]:
    """The first ``k`` batches of an epoch and the state after them (through JSON)."""
    head = []
    for i, batch in enumerate(loader):
        head.append(batch)
        if i + 1 == k:
            state = loader.state_dict()
            break
    return head, json.loads(json.dumps(state))
