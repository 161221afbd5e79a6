"""End to end through HTTP: examples/serve_http.py served by uvicorn on 127.0.0.1, driven by httpx."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

MISSING = [m for m in ("starlette", "uvicorn", "httpx") if importlib.util.find_spec(m) is None]
if MISSING:
    print(f"test_serve_http: skipped, {', '.join(MISSING)} not installed (pip install 'gpufeed[dev]')")
    pytest.skip(f"{', '.join(MISSING)} not installed (the dev extra has them)", allow_module_level=True)

import httpx  # noqa: E402
import uvicorn  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "serve_http.py"


def _load_example() -> Any:
    spec = importlib.util.spec_from_file_location("gpufeed_example_serve_http", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _jpeg(seed: int) -> bytes:
    import cv2

    rng = np.random.default_rng(seed)
    img = cv2.resize(rng.integers(0, 255, (8, 10, 3), dtype=np.uint8), (160, 120))
    ok, buf = cv2.imencode(".jpg", img)
    assert ok
    return buf.tobytes()


class _Served:
    """uvicorn on 127.0.0.1, an OS-chosen port, in a background thread; stopped by should_exit."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="test-uvicorn", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(20)
        assert not self.thread.is_alive(), "uvicorn did not shut down"


def _post_all(url: str, bodies: list[bytes]) -> list[httpx.Response]:
    async def go() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=len(bodies))
        async with httpx.AsyncClient(base_url=url, timeout=20, limits=limits) as client:
            return await asyncio.gather(*(client.post("/predict", content=b) for b in bodies))

    return asyncio.run(go())


def _gpufeed_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("gpufeed-batcher", "test-uvicorn"))]


@pytest.mark.timeout(60)
def test_concurrent_requests_are_batched_and_answered() -> None:
    example = _load_example()
    app = example.create_app(max_batch_size=8, max_delay_ms=50, max_queue=64)
    with _Served(app) as url:
        responses = _post_all(url, [_jpeg(i) for i in range(20)])
        assert [r.status_code for r in responses] == [200] * 20, [r.text for r in responses]
        for r in responses:
            body = r.json()
            assert 0 <= body["class"] < 10 and len(body["top5"]) == 5
        bad = httpx.post(f"{url}/predict", content=b"not a jpeg", timeout=20)
        assert bad.status_code == 400
        stats = httpx.get(f"{url}/stats", timeout=20).json()
        assert stats["completed"] == 20
        assert stats["batch_size_mean"] > 1, stats
    assert app.state.batcher.closed
    assert _gpufeed_threads() == []


@pytest.mark.timeout(60)
def test_overload_answers_503() -> None:
    example = _load_example()
    release = threading.Event()

    def slow_model(x: torch.Tensor) -> torch.Tensor:
        release.wait(10)  # hold the one model slot until the queue has filled
        return torch.zeros(len(x), 10)

    app = example.create_app(slow_model, max_batch_size=1, max_delay_ms=0, max_queue=2, timeout_s=20)
    with _Served(app) as url:

        async def go() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=20) as client:
                tasks = [asyncio.create_task(client.post("/predict", content=_jpeg(i))) for i in range(8)]
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline:  # until every request was queued or refused
                    stats = app.state.batcher.stats()
                    if stats["requests"] + stats["rejected"] == len(tasks):
                        break
                    await asyncio.sleep(0.02)
                release.set()
                return await asyncio.gather(*tasks)

        codes = sorted(r.status_code for r in asyncio.run(go()))
        rejected = app.state.batcher.stats()["rejected"]
    # at most one request in the model and two queued: the rest were refused at once, not queued
    assert set(codes) == {200, 503} and 2 <= codes.count(200) <= 3, codes
    assert codes.count(503) == rejected
    assert _gpufeed_threads() == []


@pytest.mark.timeout(120)
def test_images_mode_decodes_in_workers_started_by_forkserver() -> None:
    """The server is threaded (uvicorn), so the decode workers come from the fork server."""
    import psutil

    example = _load_example()
    net = example.small_cnn()
    app = example.create_app(net, max_batch_size=8, max_delay_ms=50, max_queue=64, timeout_s=60, images=True,
                             num_workers=1)
    with _Served(app) as url:
        batcher = app.state.batcher
        assert batcher.mp_context == "forkserver"
        pids = batcher.worker_pids
        bodies = [_jpeg(i) for i in range(12)]
        responses = _post_all(url, bodies)
        assert [r.status_code for r in responses] == [200] * 12, [r.text for r in responses]
        bad = httpx.post(f"{url}/predict", content=b"not a jpeg", timeout=60)
        assert bad.status_code == 400 and "request #" in bad.json()["error"]
        stats = httpx.get(f"{url}/stats", timeout=20).json()
        assert stats["completed"] == 12 and stats["decoded"] == 12 and stats["undecodable"] == 1
        assert stats["batch_size_mean"] > 1, stats
    # The same answers as the DynamicBatcher path, which decodes in the request's thread.
    plain = example.create_app(net, max_batch_size=8, max_delay_ms=50, max_queue=64)
    with _Served(plain) as url:
        expected = _post_all(url, bodies)
    for got, want in zip(responses, expected):
        assert got.json()["class"] == want.json()["class"]
        assert got.json()["score"] == pytest.approx(want.json()["score"], rel=1e-4, abs=1e-5)
    assert batcher.closed
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert _gpufeed_threads() == []
