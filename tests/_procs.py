"""Child processes a test may blame on gpufeed.

multiprocessing starts helper processes of its own that outlive any loader: the resource
tracker (spawn/forkserver) and the fork server. They are not gpufeed workers.
"""

from __future__ import annotations

import os

import psutil

_MP_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _is_mp_helper(proc: psutil.Process) -> bool:
    try:
        cmdline = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
    return any(helper in cmdline for helper in _MP_HELPERS)


def live_children() -> list[psutil.Process]:
    """Running, non-zombie descendants of this process, multiprocessing's helpers excluded."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and not _is_mp_helper(proc):
                out.append(proc)
        except psutil.NoSuchProcess:
            continue
    return out


def gpufeed_memfds() -> dict[int, str]:
    """This process's open gpufeed arena descriptors: fd -> its ``/proc/self/fd`` target."""
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, for one)
        if "memfd:gpufeed" in target:
            out[int(fd)] = target
    return out
