"""The models a server holds: their names, what they take and give, and whether they batch.

A model's name is its file name without the suffix (``resnet.onnx`` → ``resnet``) unless the user
names it; names are unique and URL-safe. ``ServedModel.check`` is the gate between a decoded request
and the model: it refuses a wrong input name, datatype or shape with a 400 that names the input and
what the model expects, and says how the request may be batched.

Batching rule. Requests are stacked along axis 0 only when the model is per-sample there, as
``verify.batching`` decides for ``serve`` and ``run`` alike (a batch of 2 against two single runs;
``batching`` overrides it): then each output row belongs to one input row and the batch can be
split back per request. A model whose outputs do not carry it (NMS indices, a pooled statistic, a
fixed batch of 1) runs each request alone. Requests are stacked only with requests whose other
dimensions are equal (the batch ``key``), so shapes are never mixed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from modelpress.errors import OptionError
from modelpress.ir.dims import dim_name, static_dim
from modelpress.serve.errors import RequestError
from modelpress.serve.protocol import datatype_name

if TYPE_CHECKING:
    import onnx_ir as ir

# The graph's tools (onnx_ir, shape inference, sessions, the batching check) are imported where an
# ONNX model is opened: a server of LLM folders alone holds an empty repository and never loads
# them (with onnx and sympy, 50 MB of resident memory: benchmarks/results/serve_llm.md).

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")

JSON_CHARS_PER_VALUE = 26  # "-1.2345678901234567e-308, " : the longest a number prints
HEADER_SLACK = 64 * 1024  # names, datatypes, shapes, parameters, whitespace

Dim = int | str | None  # a size (-1 or 0: any), a named dynamic dimension, or an unnamed one


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype
    shape: tuple[Dim, ...] | None  # None: rank unknown

    @property
    def datatype(self) -> str:
        return datatype_name(self.dtype)

    def wire_shape(self) -> list[int]:
        """The shape as the protocol writes it: -1 for a dynamic dimension."""
        return [d if static_dim(d) is not None else -1 for d in self.shape or ()]

    def to_dict(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": self.wire_shape()}


def _spec(value: ir.Value) -> TensorSpec:
    dtype = np.dtype(value.dtype.numpy()) if value.dtype is not None else np.dtype(np.float32)
    shape = None
    if value.shape is not None:
        shape = tuple(d if isinstance(d, int) else dim_name(d) for d in value.shape)
    return TensorSpec(value.name, dtype, shape)


def model_name(path: str | Path, given: str | None = None) -> str:
    """The name a model is served under: ``given``, or the file name without its suffix."""
    name = given if given is not None else Path(path).name.split(".")[0]
    if not _NAME.match(name):
        raise OptionError(
            f"model name {name!r} (from {path}): use letters, digits, '_', '-' and '.' (give one with --name)"
        )
    return name


class ServedModel:
    """One model behind the server: its session, its tensors, and how its requests batch."""

    def __init__(
        self,
        name: str,
        model: ir.Model,
        session,
        *,
        version: str = "1",
        processing=None,
        batching: str | None = None,
    ):
        from modelpress.verify.batching import decide_batching

        self.name = name
        self.version = version
        self.session = session  # anything with run(feeds) -> outputs (runtime.session.Session)
        self.processing = processing  # runtime.processing.Processing, when the model declares one
        graph = model.graph
        self.inputs = [_spec(v) for v in graph.inputs if v.name not in graph.initializers]
        self.outputs = [_spec(v) for v in graph.outputs]
        if any(o.shape is None for o in self.outputs):
            self.outputs = _inferred_outputs(model, self.outputs)
        # one decision for serve and run (verify.batching): by evidence when there is a session
        run = (lambda feeds: session.run(feeds, check=False)) if session is not None else None
        rule = decide_batching(model, run, override=batching)
        self.batch_reason = rule.reason or (
            f"the model fixes its batch at {rule.fixed}" if rule.fixed is not None else ""
        )
        per_sample = rule.per_sample and rule.fixed is None
        self.batch_dim = (_batch_dim(self.inputs, self.outputs) or "axis 0") if per_sample else None
        self._graph = graph  # to name the inputs behind a node the runtime blames (inputs_of)
        self._inputs = {s.name: s for s in self.inputs}
        self._outputs = {s.name: s for s in self.outputs}
        self._max_body: dict[int, int | None] = {}

    @property
    def batchable(self) -> bool:
        return self.batch_dim is not None

    def metadata(self) -> dict:
        return {
            "name": self.name,
            "versions": [self.version],
            "platform": "onnxruntime_onnx",
            "inputs": [s.to_dict() for s in self.inputs],
            "outputs": [s.to_dict() for s in self.outputs],
        }

    def config(self, *, max_batch: int) -> dict:
        """Triton's model configuration (``/config``), which tools such as perf_analyzer read.
        A batchable model's tensors are listed without the batch dimension, as Triton does."""
        batched = self.batchable and max_batch > 1

        def dims(s: TensorSpec) -> list[int]:
            shape = s.wire_shape()
            return shape[1:] if batched else shape

        def entry(s: TensorSpec) -> dict:
            kind = "STRING" if s.datatype == "BYTES" else s.datatype  # Triton's config names
            return {"name": s.name, "data_type": f"TYPE_{kind}", "dims": dims(s)}

        return {
            "name": self.name,
            "platform": "onnxruntime_onnx",
            "backend": "onnxruntime",
            "max_batch_size": max_batch if batched else 0,
            "input": [entry(s) for s in self.inputs],
            "output": [entry(s) for s in self.outputs],
            "dynamic_batching": {} if batched else None,
        }

    def check(
        self, arrays: dict[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], int, tuple | None]:
        """The feeds in the model's input order, the rows the request brings along axis 0, and its
        batch key (None: run it alone). ``RequestError`` (400) names the first input that is wrong."""
        for name in arrays:
            if name not in self._inputs:
                raise RequestError(
                    400,
                    f"model {self.name!r} has no input {name!r} (inputs: {', '.join(self._inputs)})",
                )
        feeds: dict[str, np.ndarray] = {}
        seen: dict[str, tuple[str, int]] = {}  # dynamic dimension → (input, size) first seen
        for spec in self.inputs:
            if spec.name not in arrays:
                raise RequestError(400, f"input {spec.name!r} of model {self.name!r} is missing")
            arr = arrays[spec.name]
            if arr.dtype != spec.dtype:
                raise RequestError(
                    400,
                    f"input {spec.name!r} is {datatype_name(arr.dtype)}, model {self.name!r} expects {spec.datatype}",
                )
            self._check_shape(spec, arr.shape, seen)
            feeds[spec.name] = arr
        if not self.batchable:
            # runs alone, but counts the rows it brings (as Triton counts inferences)
            leading = {a.shape[0] if a.ndim else None for a in feeds.values()}
            rows = leading.pop() if len(leading) == 1 else None
            return feeds, rows if rows is not None else 1, None
        rows = next(iter(feeds.values())).shape[0]
        if rows == 0:
            return feeds, 0, None
        return feeds, rows, tuple(a.shape[1:] for a in feeds.values())

    def _check_shape(self, spec: TensorSpec, shape: tuple[int, ...], seen: dict) -> None:
        if spec.shape is None:
            return
        if len(shape) != len(spec.shape) or any(
            static_dim(want) is not None and got != want for got, want in zip(shape, spec.shape)
        ):
            raise RequestError(
                400,
                f"input {spec.name!r} has shape {list(shape)}, model {self.name!r} expects {spec.wire_shape()}",
            )
        for axis, (got, want) in enumerate(zip(shape, spec.shape)):
            if isinstance(want, str):
                other = seen.setdefault(want, (spec.name, got))
                if other[1] != got:
                    raise RequestError(
                        400,
                        f"input {spec.name!r} has size {got} on axis {axis} ({want!r}), "
                        f"but input {other[0]!r} has {other[1]} there: model {self.name!r} needs them equal",
                    )

    def output_names(self, requested: Iterable[str] | None) -> list[str]:
        """The outputs to return: all, or the ones asked for (404 for a name the model lacks)."""
        if requested is None:
            return [s.name for s in self.outputs]
        names = list(requested)
        for name in names:
            if name not in self._outputs:
                raise RequestError(
                    400,
                    f"model {self.name!r} has no output {name!r} (outputs: {', '.join(self._outputs)})",
                )
        return names

    def max_body_bytes(self, rows: int) -> int | None:
        """The largest body a valid request of at most ``rows`` rows can have, when every input's
        size per row is fixed (None otherwise): its values as JSON text (at most
        ``JSON_CHARS_PER_VALUE`` each) or binary, whichever is larger, plus ``HEADER_SLACK``
        for the rest of the request. A body declaring more is refused before it is read."""
        if rows not in self._max_body:  # asked on every request: worked out once
            self._max_body[rows] = self._largest_body(rows)
        return self._max_body[rows]

    def _largest_body(self, rows: int) -> int | None:
        total = 0
        for spec in self.inputs:
            if spec.shape is None or spec.dtype.kind in "OSU":
                return None
            dims = spec.shape[1:] if self.batchable else spec.shape
            if any(static_dim(d) is None for d in dims):
                return None
            count = int(np.prod([static_dim(d) for d in dims], dtype=np.int64))
            per_value = max(spec.dtype.itemsize, JSON_CHARS_PER_VALUE)
            total += count * per_value * (rows if self.batchable else 1)
        return total + HEADER_SLACK

    def inputs_of(self, op_type: str, node_name: str) -> list[str]:
        """The model inputs that feed the node ``node_name`` (every ``op_type`` node when the name
        is empty), in the model's order: what a client may be told about a failing node."""
        nodes = [
            n
            for n in self._graph.all_nodes()
            if n.op_type == op_type and (not node_name or n.name == node_name)
        ]
        found, seen = set(), set()
        todo = [v for n in nodes for v in n.inputs if v is not None]
        while todo:
            value = todo.pop()
            if id(value) in seen:
                continue
            seen.add(id(value))
            if value.name in self._inputs:
                found.add(value.name)
            producer = value.producer()
            if producer is not None:
                todo += [v for v in producer.inputs if v is not None]
        return [s.name for s in self.inputs if s.name in found]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.session.run(feeds, check=False)


def _inferred_outputs(model: ir.Model, outputs: list[TensorSpec]) -> list[TensorSpec]:
    """Output shapes from shape inference, where the file does not declare them."""
    from modelpress.ir.shapes import infer_shapes

    try:
        inferred = {v.name: _spec(v) for v in infer_shapes(model).graph.outputs}
    except Exception:  # inference is a bonus here: without it the model just runs unbatched
        return outputs
    return [inferred.get(o.name, o) if o.shape is None else o for o in outputs]


def _batch_dim(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> str | None:
    """The named dynamic dimension on axis 0 of every input and output, or None."""
    if not inputs or not outputs:
        return None
    firsts = {s.shape[0] if s.shape else None for s in [*inputs, *outputs]}
    if len(firsts) != 1:
        return None
    dim = firsts.pop()
    return dim if isinstance(dim, str) and dim else None


class Repository:
    """The served models by name."""

    def __init__(self, models: Iterable[ServedModel]):
        self.models: dict[str, ServedModel] = {}
        for m in models:
            if m.name in self.models:
                raise OptionError(
                    f"two models are named {m.name!r}: give them different --name values"
                )
            self.models[m.name] = m

    def get(self, name: str, version: str | None = None) -> ServedModel:
        model = self.models.get(name)
        if model is None:
            raise RequestError(404, f"no model named {name!r} (models: {', '.join(self.models)})")
        if version not in (None, "", model.version):
            raise RequestError(
                404, f"model {name!r} has no version {version!r} (versions: {model.version})"
            )
        return model

    def index(self) -> list[dict]:
        return [
            {"name": m.name, "version": m.version, "state": "READY"} for m in self.models.values()
        ]

    @classmethod
    def open(
        cls,
        models: list[tuple[str, ir.Model]],
        *,
        backend: str = "ort",
        device: str = "auto",
        place: list[str] | None = None,
        strict: bool = False,
        batching: str | None = None,
    ) -> Repository:
        """Sessions for ``(name, model)`` pairs on the given backend and device, each model with the
        processing it declares (``runtime.processing``), when it declares one."""
        from modelpress.runtime.ort_backend import OrtBackend, OrtOptions
        from modelpress.runtime.processing import Processing
        from modelpress.runtime.session import Session

        if backend == "ort":
            # idle runtime threads must not spin on the cores the event loop needs between runs
            backend = OrtBackend(OrtOptions(spin=False))
        served = []
        for name, model in models:
            session = Session(model, backend=backend, device=device, place=place, strict=strict)
            processing = Processing.from_model(model)
            served.append(
                ServedModel(name, model, session, processing=processing, batching=batching)
            )
        return cls(served)

    @property
    def warnings(self) -> list[str]:
        out = []
        for m in self.models.values():
            out += [f"{m.name}: {w}" for w in getattr(m.session, "warnings", [])]
        return out
