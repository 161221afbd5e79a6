"""What every benchmark result records about the machine and the software it ran on."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import platform
import sys

from gpufeed._engine.context import usable_cores

__all__ = ["cpu_model", "decode_backend", "describe_environment", "package_version"]


def package_version(name: str, distribution: str | None = None) -> str:
    """Version of an installed module (``name.__version__``, else its distribution), or 'n/a'."""
    try:
        return importlib.metadata.version(distribution or name)
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        module = importlib.import_module(name)
    except ImportError:
        return "n/a"
    return str(getattr(module, "__version__", "n/a"))


def cpu_model(cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else :func:`platform.processor`, else 'n/a'."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model", "Hardware", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "n/a"


def decode_backend() -> str:
    """The decode backend(s) gpufeed would use (``gpufeed.backends()``), or 'n/a'."""
    try:
        decode = importlib.import_module("gpufeed.decode")
    except ImportError:
        return "n/a"
    backends = getattr(decode, "backends", None)
    if not callable(backends):
        return "n/a"
    try:
        found = backends()
    except Exception as exc:  # noqa: BLE001 - a result records the failure instead of dying
        return f"error: {type(exc).__name__}: {exc}"
    if isinstance(found, str):
        return found
    if isinstance(found, dict):
        return ", ".join(f"{k}={v}" for k, v in found.items())
    try:
        return ", ".join(str(b) for b in found)
    except TypeError:
        return str(found)


def describe_environment(num_workers: int | None = None) -> dict[str, object]:
    """Versions, CPU and settings to store next to a benchmark result (JSON-serialisable).

    Args:
        num_workers: the loaders' ``num_workers`` in this run (None: not applicable).
    """
    return {
        "gpufeed": package_version("gpufeed"),
        "torch": package_version("torch"),
        "numpy": package_version("numpy"),
        "cv2": package_version("cv2", "opencv-python-headless"),
        "psutil": package_version("psutil"),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "executable": sys.executable,
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count() or 0,
        "usable_cores": usable_cores(),  # affinity, cgroup quota
        "decode_backend": decode_backend(),
        "num_workers": num_workers,
    }
