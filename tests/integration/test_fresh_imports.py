"""What importing gpufeed's modules does, and `python -m gpufeed`, each read from a fresh
interpreter (tests/_imports.py), run side by side (tests/conftest.py)."""

from __future__ import annotations

import json

import pytest

import gpufeed
from tests._concurrent import python, result
from tests._imports import FRESH_IMPORTS
from tests._imports import facts as import_facts

SIDE_BY_SIDE = {  # see tests/conftest.py
    "fresh-imports": FRESH_IMPORTS,
    "pack-python-m-gpufeed": (2.2, python("-m", "gpufeed", "backends")),
}


@pytest.fixture(scope="module")
def plain_import(side_by_side) -> dict:
    return import_facts(result(side_by_side, "fresh-imports"), "plain")


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_import_starts_no_thread_process_or_decoder(plain_import):
    assert plain_import["threads"] == ["MainThread"]
    assert plain_import["children"] == 0
    assert not plain_import["turbojpeg"]


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_tune_and_doctor_modules_work_after_a_plain_import(plain_import):
    assert not plain_import["tune"]  # imported on first use, not by import gpufeed
    assert plain_import["tune_callable"] and plain_import["diagnose"]
    with pytest.raises(AttributeError, match="no_such_name"):
        gpufeed.no_such_name  # noqa: B018


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_import_loads_no_backend(side_by_side):
    """Importing gpufeed.decode, transforms, sources and synth imports no decoder or LMDB."""
    assert import_facts(result(side_by_side, "fresh-imports"), "decode") == {"backends": []}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_importing_gpufeed_serve_starts_nothing(side_by_side):
    facts = import_facts(result(side_by_side, "fresh-imports"), "serve")
    assert facts == {"threads": ["MainThread"], "prometheus_client": False}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_missing_prometheus_client_is_a_clear_error(side_by_side):
    """prometheus_client unimportable: ``serve(0)`` and ``FastLoader(..., metrics_port=0)`` each
    raise BackendUnavailableError with the fix, and start no thread."""
    facts = import_facts(result(side_by_side, "fresh-imports"), "missing_prometheus")
    assert len(facts["errors"]) == 2, facts
    for line in facts["errors"]:
        assert "prometheus-client" in line and "pip install 'gpufeed[metrics]'" in line
    assert facts["threads"] == ["MainThread"]


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_importing_gpufeed_metrics_has_no_side_effects(side_by_side):
    facts = import_facts(result(side_by_side, "fresh-imports"), "metrics")
    assert facts == {"threads": ["MainThread"], "prometheus_client": False, "registry_unchanged": True}


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_python_dash_m_gpufeed(side_by_side):
    proc = result(side_by_side, "pack-python-m-gpufeed")
    assert proc.returncode == 0, proc.stderr
    assert "turbojpeg" in json.loads(proc.stdout)
