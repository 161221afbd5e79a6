"""Resume a loader in a fresh process (test_resume_workers.py): loads the state in argv[1],
iterates the rest of the epoch and saves the batches to argv[2] (torch.save)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the gpufeed under test

from tests.integration.test_resume_workers import drawing  # noqa: E402


def main() -> None:
    state = json.loads(Path(sys.argv[1]).read_text())
    loader = drawing(int(sys.argv[3]))
    loader.load_state_dict(state)
    import torch

    torch.save(list(loader), sys.argv[2])


if __name__ == "__main__":
    main()
