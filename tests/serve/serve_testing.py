"""Models and a server process for the serving tests.

The models are built here in a few lines each (no downloads): a small CNN with a named batch
dimension and dynamic image size, an embedding encoder with two inputs sharing ``batch`` and
``seq`` (an out-of-vocabulary id makes ONNX Runtime fail on that request), a model whose output is
not per row (NonZero indices), and a slow MLP for back-pressure and shutdown tests.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
VOCAB = 50


def _save(graph: onnx.GraphProto, path: Path) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def cnn(path: Path) -> Path:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    g = rng.standard_normal((8, 5)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("MatMul", ["f", "G"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, "h", "w"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(g, "G")],
    )
    return _save(graph, path)


def encoder(path: Path) -> Path:
    """ids, mask: int64[batch, seq] → mean of the masked embeddings, float[batch, 4]."""
    table = np.random.default_rng(1).standard_normal((VOCAB, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "ids"], ["e"]),
        helper.make_node("Cast", ["mask"], ["m"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["m", "axis2"], ["m3"]),
        helper.make_node("Mul", ["e", "m3"], ["em"]),
        helper.make_node("ReduceSum", ["em", "axis1"], ["s"], keepdims=0),
        helper.make_node("ReduceSum", ["m", "axis1"], ["n"], keepdims=1),
        helper.make_node("Div", ["s", "n"], ["pooled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "encoder",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", 4])],
        [
            numpy_helper.from_array(table, "E"),
            numpy_helper.from_array(np.array([2], np.int64), "axis2"),
            numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        ],
    )
    return _save(graph, path)


def nonzero(path: Path) -> Path:
    """x float[batch, 4] → the indices of its positive entries, int64[2, count]: not per row."""
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["pos"]),
        helper.make_node("NonZero", ["pos"], ["idx"]),
    ]
    graph = helper.make_graph(
        nodes,
        "nonzero",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [2, "count"])],
        [numpy_helper.from_array(np.array(0, np.float32), "zero")],
    )
    return _save(graph, path)


def slow(path: Path, layers: int = 40) -> Path:
    """x float[batch, 256, 512] → tanh chain of ``layers`` 512x512 MatMuls (5 GFLOP a row: tens
    of milliseconds), y float[batch, 512]."""
    w = (np.random.default_rng(2).standard_normal((512, 512)) / 23).astype(np.float32)
    nodes, prev = [], "x"
    for i in range(layers):
        nodes += [
            helper.make_node("MatMul", [prev, "W"], [f"m{i}"]),
            helper.make_node("Tanh", [f"m{i}"], [f"t{i}"]),
        ]
        prev = f"t{i}"
    nodes.append(helper.make_node("ReduceMean", [prev], ["y"], axes=[1], keepdims=0))
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 256, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 512])],
        [numpy_helper.from_array(w, "W")],
    )
    return _save(graph, path)


class ServerProcess:
    """``modelpress serve`` in a child process on 127.0.0.1 and a free port; stopped by the test."""

    def __init__(self, args: list[str], *, timeout: float = 60.0):
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelpress.cli.main",
                "serve",
                *args,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.lines: list[str] = []
        deadline = time.monotonic() + timeout
        self.port = None
        while self.port is None:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read()
                raise RuntimeError(
                    f"the server did not start (exit {self.proc.wait()}): {err[-2000:]}"
                )
            self.lines.append(line)
            found = re.search(r"serving on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not start in time")
        self.url = f"127.0.0.1:{self.port}"

    def metric(self, name: str, headers: dict | None = None) -> float:
        """The sum of a metric's samples whose name and labels start with ``name``."""
        req = urllib.request.Request(f"http://{self.url}/metrics", headers=headers or {})
        text = urllib.request.urlopen(req, timeout=10).read().decode()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
