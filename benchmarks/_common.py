"""Helpers the benchmark scripts share: CPU seconds of processes, the host's load."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable

import psutil


def cpu_s_by_pid(pids: Iterable[int]) -> dict[int, float]:
    """User + system CPU seconds of each live process in ``pids`` (one gone is left out)."""
    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        out[pid] = t.user + t.system
    return out


def tree_cpu_s() -> float:
    """CPU seconds (user + system) of this process and its live children (e.g. decode workers)."""
    me = psutil.Process()
    try:
        children = me.children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    return sum(cpu_s_by_pid([me.pid, *(c.pid for c in children)]).values())


def uptime() -> str:
    """``uptime``'s line (the load averages a result records beside its figures), or the load
    averages alone where the command is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return f"load average {os.getloadavg()}"
