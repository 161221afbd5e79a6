"""Several ``torchrun`` launches, one after the other, from one launcher process (tests/integration/_torchrun.py).

    python _torchrun_chain.py SPEC.json

``python -m torch.distributed.run`` costs ~2.5 s of CPU before it starts any rank (importing
torch); a test that runs a script twice (stopped, then resumed) pays it once here. Each launch
still starts fresh rank processes, with this launcher's arguments and environment. ``SPEC``: a
list of launches, each {"args": the arguments after ``torchrun``'s own (script and its arguments),
"nproc": ranks, "stdout", "stderr": files for the launch's output (the launcher's and its ranks'),
"record": a path or null}. After each launch it writes ``SPEC.result.json``: per launch run so far
{"returncode": 0 or 1 (as ``torchrun`` exits), "record": the sorted names in ``record`` if it is a
folder, whether it exists otherwise}. A launch that fails ends the chain.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(launch: dict[str, Any]) -> int:
    """One torchrun launch, its output (the ranks inherit fds 1 and 2) to its files: 0 or 1."""
    for _ in range(3):  # another process may take the free port between our check and torchrun's bind
        argv = ["--nnodes", "1", "--nproc_per_node", str(launch["nproc"]), "--master_addr", "127.0.0.1",
                "--master_port", str(_free_port()), *launch["args"]]
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        with open(launch["stdout"], "ab") as out, open(launch["stderr"], "ab") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                run(parse_args(argv))
                code = 0
            except ChildFailedError as exc:
                print(exc, file=sys.stderr)
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
        with open(launch["stderr"], encoding="utf-8", errors="replace") as err_text:
            if code == 0 or "address already in use" not in err_text.read().lower():
                return code
    return code


def main(spec_path: str) -> None:
    with open(spec_path, encoding="utf-8") as f:
        launches = json.load(f)
    results: list[dict[str, Any]] = []
    for launch in launches:
        code = _launch(launch)
        record = launch.get("record")
        seen: Any = None
        if record is not None:
            seen = sorted(os.listdir(record)) if os.path.isdir(record) else os.path.exists(record)
        results.append({"returncode": code, "record": seen})
        with open(spec_path + ".result.json", "w", encoding="utf-8") as f:
            json.dump(results, f)
        if code != 0:
            break


if __name__ == "__main__":
    main(sys.argv[1])
