"""Running the repository's scripts (benchmarks/, examples/) from tests: their environment, and
loading one as a module to test its functions."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def script_env() -> dict[str, str]:
    """This environment with the repository first on PYTHONPATH, and no ``OUT`` (a script that
    writes its figures under ``$OUT`` on a GPU machine writes none here)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.pop("OUT", None)
    return env


def load_script(path: Path, name: str) -> ModuleType:
    """The script at ``path`` imported as module ``name`` (registered in ``sys.modules``, where
    dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
