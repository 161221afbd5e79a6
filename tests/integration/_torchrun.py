"""Run a script under ``torchrun`` (CPU ranks, gloo) from a test: this tree's gpufeed, a free port."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(script: Path, *args: str, nproc: int = 2, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """``python -m torch.distributed.run --nproc_per_node NPROC SCRIPT ARGS`` with a free port."""
    # The ranks import this tree's gpufeed, whatever copy is installed.
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    for _ in range(3):  # another process may take the free port between our check and torchrun's bind
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", str(_free_port()), str(script), *args]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        if out.returncode == 0 or "address already in use" not in out.stderr.lower():
            return out
    return out


def result(out: subprocess.CompletedProcess[str], tag: str = "RESULT ") -> Any:
    """The JSON after ``tag`` on the one stdout line that starts with it (asserts the run passed)."""
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(tag)]
    return json.loads(line.removeprefix(tag))


def torchrun_chain(workdir: Path, *launches: tuple[Path, tuple[str, ...], Path | None], nproc: int = 2,
                   timeout: float = 300) -> list[tuple[subprocess.CompletedProcess[str], Any]]:
    """``torchrun SCRIPT ARGS`` for each (SCRIPT, ARGS, RECORD) of ``launches``, one after the other
    from one launcher process (``_torchrun_chain.py``: one import of torch for all of them), each
    with fresh ranks and a free port, until one fails. Returns per launch run: (its result, as
    ``torchrun`` would have returned it; the names in the folder RECORD right after it, or
    whether the file RECORD exists, or None)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    workdir.mkdir(parents=True, exist_ok=True)
    spec = [{"args": [str(script), *args], "nproc": nproc, "stdout": str(workdir / f"launch-{i}.out"),
             "stderr": str(workdir / f"launch-{i}.err"), "record": None if record is None else str(record)}
            for i, (script, args, record) in enumerate(launches)]
    spec_path = workdir / "chain.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).with_name("_torchrun_chain.py")), str(spec_path)]
    chain = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
    done = Path(f"{spec_path}.result.json")
    assert chain.returncode == 0 and done.exists(), f"the launcher failed: {chain.stdout[-2000:]}{chain.stderr[-4000:]}"
    return [(subprocess.CompletedProcess(["torchrun", *launch["args"]], result["returncode"],
                                         Path(launch["stdout"]).read_text(), Path(launch["stderr"]).read_text()),
             result["record"])
            for launch, result in zip(spec, json.loads(done.read_text()), strict=False)]
