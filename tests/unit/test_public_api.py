"""The public surface: __all__ is sorted and complete, and importing gpufeed starts nothing."""

from __future__ import annotations

import inspect
import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader

import gpufeed
from gpufeed import FastLoader


def test_all_is_sorted_and_complete():
    assert gpufeed.__all__ == sorted(gpufeed.__all__)
    public = {n for n, v in vars(gpufeed).items() if not n.startswith("_") and not inspect.ismodule(v)}
    assert public == set(gpufeed.__all__)


def test_import_starts_no_thread_process_or_decoder():
    code = (
        "import threading, sys, gpufeed, multiprocessing as mp;"
        "assert threading.active_count() == 1, threading.enumerate();"
        "assert not mp.active_children();"
        "assert 'turbojpeg' not in sys.modules;"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_fastloader_is_a_dataloader_with_its_signature_plus_keyword_options():
    loader = FastLoader(torch.utils.data.TensorDataset(torch.arange(4)))
    assert isinstance(loader, DataLoader)
    ours = inspect.signature(FastLoader).parameters
    theirs = inspect.signature(DataLoader.__init__).parameters
    for name, param in theirs.items():
        if name == "self":
            continue
        assert ours[name].default == param.default and ours[name].kind == param.kind
    extra = [p for n, p in ours.items() if n not in theirs]
    assert extra and all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in extra)
    assert FastLoader[int] is not None  # stays generic for type checkers


def test_tune_and_doctor_modules_work_after_a_plain_import():
    code = (
        "import sys, gpufeed;"
        "assert 'gpufeed.tune' not in sys.modules;"  # imported on first use, not by import gpufeed
        "assert callable(gpufeed.tune.tune) and callable(gpufeed.doctor.diagnose);"
        "assert gpufeed.diagnose is gpufeed.doctor.diagnose;"
        "print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    with pytest.raises(AttributeError, match="no_such_name"):
        gpufeed.no_such_name  # noqa: B018
