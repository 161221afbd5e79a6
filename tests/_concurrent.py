"""Run independent subprocess scenarios side by side, so that their start-up overlaps: the
helpers behind the ``side_by_side`` fixture (tests/conftest.py).

Most of a fresh interpreter's time in this suite is its single-threaded import of torch
(~2 s of CPU each); on a 2-core CI machine two such runs side by side take little longer than
one. Only for scenarios whose checks look at their own processes, files and output, never at
the whole machine's process table or /dev/shm.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

K = TypeVar("K")
T = TypeVar("T")


def width() -> int:
    """How many scenarios run at once: one per usable core, at least 2, at most 4 (more would
    gain little: the longest run, a chain of Lightning process trees, bounds the batch)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(4, max(2, cores))


def guarded(job: Callable[[], T]) -> T | BaseException:
    """``job()``, or the exception it raised (``result`` re-raises it in the test that reads it)."""
    try:
        return job()
    except (Exception, pytest.fail.Exception) as exc:
        return exc


def call_all(jobs: Mapping[K, Callable[[], T]], parallel: int | None = None) -> dict[K, T | BaseException]:
    """Call every job (each blocks on its own subprocesses) in threads, ``parallel`` at a time,
    in the mapping's order; returns each job's result or the exception it raised, so that one
    job's failure fails only the tests that read it."""
    with ThreadPoolExecutor(max_workers=parallel or width()) as pool:
        futures = {key: pool.submit(guarded, job) for key, job in jobs.items()}
        return {key: future.result() for key, future in futures.items()}


def result(results: Mapping[K, T | BaseException], key: K) -> T:
    """One job's result from ``call_all``; re-raises the exception that job raised."""
    return unwrap(results[key])


def unwrap(value: T | BaseException) -> T:
    """What ``guarded`` returned: the result, or the exception re-raised."""
    if isinstance(value, BaseException):
        raise value
    return value


def python(*args: str, timeout_s: float = 60, **kwargs: Any) -> Callable[[Any], subprocess.CompletedProcess[str]]:
    """A ``SIDE_BY_SIDE`` run (tests/conftest.py): ``python ARGS`` with this interpreter, output
    captured as text, ``kwargs`` passed to ``subprocess.run`` (cwd, env, ...)."""

    def run(_tmp_path_factory: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, **kwargs)

    return run
