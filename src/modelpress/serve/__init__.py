"""Serving: the Open Inference Protocol (KServe v2) with dynamic batching, on one machine or Ray.

    repo = Repository.open([("resnet", model)], device="auto")
    serve(repo, ServeOptions(max_batch=32, max_delay_ms=2), host="127.0.0.1", port=8000)

One concept a file: ``protocol`` (tensors in and out of v2 bodies, Triton's binary extension),
``repository`` (names, tensors, the batching rule, input checks), ``batcher`` (dynamic batching),
``app`` (the FastAPI routes), ``raw`` (raw items for models that declare processing), ``auth``
(bearer key), ``metrics`` (Prometheus), ``connections`` (header deadline and connection cap in
uvicorn's HTTP protocol), ``server`` (uvicorn and graceful shutdown), ``ray_serve``
(the same app on Ray Serve). FastAPI and uvicorn come with the ``serve`` extra, Ray with ``ray``.
"""

from __future__ import annotations

from modelpress.serve.options import ServeOptions

__all__ = ["ServeOptions"]
