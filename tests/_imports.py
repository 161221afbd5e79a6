"""One fresh interpreter for the suite's checks of what importing gpufeed's modules does: the
``fresh-imports`` side-by-side run (tests/conftest.py), shared by the modules whose tests read it.

Each step imports more and records its facts, so a later step's facts hold for everything
imported before it too (a module that one step says is not imported was imported by no step
before it): ``import gpufeed`` (threads, children, decoders, gpufeed.tune not yet imported);
``gpufeed.serve``; the decode, transform, source and synth modules (no decode or LMDB backend);
``gpufeed.metrics`` (no prometheus_client, no thread); the lazy first use of ``gpufeed.tune``;
then prometheus_client made unimportable (``metrics.start_server`` and a loader's ``metrics_port`` say
so), then imported (``metrics.start_server`` leaves prometheus_client's global registry alone).
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests._concurrent import python

SCRIPT = """
import json, sys, threading, multiprocessing as mp
facts = {}
names = lambda: [t.name for t in threading.enumerate()]

import gpufeed
facts["plain"] = {"threads": names(), "children": len(mp.active_children()),
                  "turbojpeg": "turbojpeg" in sys.modules, "tune": "gpufeed.tune" in sys.modules}

import gpufeed.serve
facts["serve"] = {"threads": names(), "prometheus_client": "prometheus_client" in sys.modules}

import gpufeed.decoders, gpufeed.image, gpufeed.sources, gpufeed.synth
facts["decode"] = {"backends": [m for m in ("turbojpeg", "cv2", "lmdb") if m in sys.modules]}

import gpufeed.metrics
facts["metrics"] = {"threads": names(), "prometheus_client": "prometheus_client" in sys.modules}

facts["plain"]["tune_callable"] = callable(gpufeed.tune.tune) and callable(gpufeed.doctor.diagnose)
facts["plain"]["diagnose"] = gpufeed.diagnose is gpufeed.doctor.diagnose

sys.modules["prometheus_client"] = None  # not installed
import torch
from gpufeed import BackendUnavailableError, FastLoader
ds = torch.utils.data.TensorDataset(torch.arange(4))
errors = []
for start in (lambda: gpufeed.metrics.start_server(0), lambda: FastLoader(ds, metrics_port=0)):
    try:
        start()
    except BackendUnavailableError as exc:
        errors.append(str(exc))
facts["missing_prometheus"] = {"errors": errors, "threads": names()}

del sys.modules["prometheus_client"]
import prometheus_client
before = set(prometheus_client.REGISTRY._names_to_collectors)
srv = gpufeed.metrics.start_server(0)
facts["metrics"]["registry_unchanged"] = set(prometheus_client.REGISTRY._names_to_collectors) == before
srv.stop()
print(json.dumps(facts))
"""

FRESH_IMPORTS = (2.5, python("-c", SCRIPT))  # a SIDE_BY_SIDE entry: seconds alone on 2 idle cores


def facts(out: subprocess.CompletedProcess[str], step: str) -> dict[str, Any]:
    """The facts of one step of the run (asserts the run ended well)."""
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1])[step])
