"""Triton Inference Server as a peer of `modelpress serve` (run by ``bench_serve.py --triton``).

The server is Triton's own ``tritonserver`` binary as ``nvidia-pytriton==0.7.0`` ships it (CPU
only here): its HTTP front end (the same KServe v2 protocol and binary-tensor extension that
modelpress serves, so the same client and the same request bytes), its dynamic batcher
(``max_batch_size``, ``max_queue_delay_microseconds``), and its Python backend, which hands each
batch to this process: ONNX Runtime runs it. The wheel ships no ONNX Runtime backend, so the
model runs here rather than inside the server; that costs Triton a hop per batch (shared memory
and a ZeroMQ message).

This file runs under the separate environment bench_serve.py builds (``benchmarks/_work/
triton-venv``: pytriton, onnxruntime, numpy), never under the project's.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

DTYPES = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(int32)": np.int32}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--delay-us", type=int, default=2000)
    args = ap.parse_args()
    sess = ort.InferenceSession(args.model)
    outputs = sess.get_outputs()

    def dims(value) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else -1 for d in value.shape[1:])

    @batch
    def infer(**feeds):
        results = sess.run(None, feeds)
        return {o.name: r for o, r in zip(outputs, results, strict=True)}

    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        grpc_address="127.0.0.1",
        grpc_port=args.port + 1,
        metrics_port=args.port + 2,
        log_verbose=0,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=infer,
            inputs=[
                Tensor(name=i.name, dtype=DTYPES[i.type], shape=dims(i)) for i in sess.get_inputs()
            ],
            outputs=[Tensor(name=o.name, dtype=DTYPES[o.type], shape=dims(o)) for o in outputs],
            config=ModelConfig(
                max_batch_size=args.max_batch,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.delay_us),
            ),
        )
        triton.serve()


if __name__ == "__main__":
    main()
