"""An HTTP inference endpoint on a DynamicBatcher or an ImageBatcher (Starlette + uvicorn).

    pip install 'gpufeed[serve]'
    python examples/serve_http.py --port 8000            # DynamicBatcher, decode in the request
    python examples/serve_http.py --port 8000 --images   # ImageBatcher, decode in worker processes
    curl --data-binary @cat.jpg http://127.0.0.1:8000/predict

POST /predict takes JPEG bytes and answers ``{"class": i, "score": logit, "top5": [...]}``;
400 for bytes that do not decode, 503 when the batcher's queue is full (``Overloaded``), 504
when the request waited past its deadline (``TimeoutError``). GET /stats returns the
batcher's counters and p50/p99 (seconds).

Default: decoding + resize/crop runs in Starlette's thread pool, in the request's path; the
batcher's model thread only stacks, normalizes and runs the model (a small CNN on 96x96, random
weights). With ``--images`` (``create_app(images=True)``) the handler submits the request's
bytes as they came: an ImageBatcher decodes, crops and normalizes each batch in its worker
processes (into shared memory) and its model threads only run the model.
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np
import torch
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpufeed.errors import DecodeError
from gpufeed.image import ResizeCenterCrop
from gpufeed.serve import DynamicBatcher, ImageBatcher, Overloaded

SIZE = 96
NORMALIZE = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
MEAN = torch.tensor(NORMALIZE[0]).view(1, 3, 1, 1) * 255
STD = torch.tensor(NORMALIZE[1]).view(1, 3, 1, 1) * 255


def small_cnn(num_classes: int = 10) -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    cin = 3
    for cout in (16, 32, 64, 64):
        layers += [torch.nn.Conv2d(cin, cout, 3, 2, 1), torch.nn.ReLU(inplace=True)]
        cin = cout
    layers += [torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(cin, num_classes)]
    return torch.nn.Sequential(*layers).eval()


def create_app(
    model: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    max_batch_size: int = 16,
    max_delay_ms: float = 5.0,
    max_queue: int = 256,
    max_concurrent_batches: int = 1,
    max_latency_ms: float | None = None,
    timeout_s: float = 1.0,
    images: bool = False,
    num_workers: int = 2,
    mp_context: str = "forkserver",
) -> Starlette:
    """The app; its lifespan creates the batcher (``app.state.batcher``) and closes it.

    ``images``: an ImageBatcher with ``num_workers`` decode processes started by ``mp_context``.
    ``max_latency_ms``: the batcher's latency-aware admission (a 503 for a request predicted to
    be answered later than that; None: only ``max_queue``).
    """
    net = model if model is not None else small_cnn()
    transform = ResizeCenterCrop(size=SIZE, resize=110)

    def preprocess(data: bytes) -> torch.Tensor:
        out = np.empty((3, SIZE, SIZE), np.uint8)
        transform.apply(data, out=out)
        return torch.from_numpy(out)

    def run(inputs: list[torch.Tensor]) -> torch.Tensor:
        with torch.inference_mode():
            return net((torch.stack(inputs).float() - MEAN) / STD)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        options: dict[str, Any] = dict(max_batch_size=max_batch_size, max_delay_ms=max_delay_ms, max_queue=max_queue,
                                       max_concurrent_batches=max_concurrent_batches, max_latency_ms=max_latency_ms,
                                       name="http")
        batcher: DynamicBatcher | ImageBatcher
        if images:  # started off the event loop: the workers take a moment
            batcher = await run_in_threadpool(
                lambda: ImageBatcher(net, transform=transform, normalize=NORMALIZE, num_workers=num_workers,
                                     mp_context=mp_context, **options))
        else:
            batcher = DynamicBatcher(run, **options)
        app.state.batcher = batcher
        try:
            yield
        finally:
            batcher.close()

    async def predict(request: Request) -> JSONResponse:
        data = await request.body()
        try:
            x = data if images else await run_in_threadpool(preprocess, data)
            logits = await request.app.state.batcher.infer(x, timeout_s=timeout_s)
        except DecodeError as exc:
            return JSONResponse({"error": f"not a decodable image: {exc}"}, status_code=400)
        except Overloaded as exc:
            return JSONResponse({"error": str(exc)}, status_code=503, headers={"Retry-After": "1"})
        except TimeoutError as exc:
            return JSONResponse({"error": str(exc)}, status_code=504)
        top = torch.topk(logits, k=min(5, logits.numel()))
        return JSONResponse({
            "class": int(top.indices[0]),
            "score": float(top.values[0]),
            "top5": [[int(i), float(v)] for v, i in zip(top.values, top.indices)],
        })

    async def stats(request: Request) -> JSONResponse:
        s: dict[str, Any] = request.app.state.batcher.stats()
        keep = {k: v for k, v in s.items() if not k.endswith("_hist")}
        return JSONResponse({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in keep.items()})

    return Starlette(
        routes=[Route("/predict", predict, methods=["POST"]), Route("/stats", stats, methods=["GET"])],
        lifespan=lifespan,
    )


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description="gpufeed.serve HTTP example")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--images", action="store_true", help="ImageBatcher: decode in worker processes")
    p.add_argument("--workers", type=int, default=2, help="decode processes with --images")
    p.add_argument("--max-latency-ms", type=float, default=None,
                   help="latency-aware admission: 503 for a request predicted to take longer (default: off)")
    args = p.parse_args()
    uvicorn.run(create_app(images=args.images, num_workers=args.workers, max_latency_ms=args.max_latency_ms),
                host=args.host, port=args.port)


if __name__ == "__main__":
    main()
