"""Running the repository's scripts (benchmarks/, examples/) from tests: their environment (the
benchmarks are a package, run as ``python -m benchmarks.NAME`` and imported as modules)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH, and no ``OUT`` (a script that
    writes its figures under ``$OUT`` on a GPU machine writes none here)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("OUT", None)
    return env
