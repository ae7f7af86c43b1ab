"""Input shapes from the command line, which dimensions are dynamic (``ir.dims``), and shape
inference on the in-memory model.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import onnx
import onnx_ir as ir
import onnxruntime

from modelpress.errors import OptionError
from modelpress.ir.dims import dim_name as dim_name  # (their home is ir.dims, with no onnx)
from modelpress.ir.dims import static_dim as static_dim
from modelpress.ir.io import from_proto, to_proto
from modelpress.ir.stats import iter_graphs, iter_nodes

log = logging.getLogger(__name__)


def parse_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``["input=1x3x224x224", "mask=1x128"]`` into ``{name: shape}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        if not sep or not name:
            raise OptionError(f"`shapes` {spec!r}: expected NAME=D1xD2x..., e.g. input=1x3x224x224")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            raise OptionError(
                f"`shapes` {spec!r}: dimensions must be integers joined by 'x'"
            ) from None
        if any(d < 0 for d in shape):
            raise OptionError(f"`shapes` {spec!r}: dimensions must not be negative")
        shapes[name] = shape
    return shapes


def parse_dims(specs: list[str] | None) -> dict[str, int]:
    """Parse ``["batch=8", "seq=128"]`` into sizes for named dynamic dimensions."""
    dims: dict[str, int] = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value.isdigit():
            raise OptionError(f"`dims` {spec!r}: expected NAME=SIZE, e.g. batch=8")
        dims[name] = int(value)
    return dims


def infer_shapes(
    model: ir.Model, input_shapes: dict[str, tuple[int, ...]] | None = None
) -> ir.Model:
    """Run ONNX shape inference (with data propagation), optionally with concrete input shapes.

    Returns a new model; the one given is not changed.
    """
    proto = to_proto(model)
    if input_shapes:
        known = {i.name for i in proto.graph.input}
        for name in input_shapes:
            if name not in known:
                raise OptionError(
                    f"`shapes` {name}=...: the model has no input {name!r} (inputs: {', '.join(sorted(known))})"
                )
        for inp in proto.graph.input:
            if inp.name in input_shapes:
                shape = input_shapes[inp.name]
                tshape = inp.type.tensor_type.shape
                if tshape.dim and len(tshape.dim) != len(shape):
                    raise OptionError(
                        f"`shapes` {inp.name}: rank {len(shape)} given, the model's input has rank {len(tshape.dim)}"
                    )
                del tshape.dim[:]
                for d in shape:
                    tshape.dim.add().dim_value = d
    return from_proto(_infer(proto))


@functools.cache
def _symbolic_shape_inference():
    """ONNX Runtime's ``SymbolicShapeInference`` class, loaded from its file alone.

    Importing it the ordinary way runs ``onnxruntime/tools/__init__.py``, which imports torch (over
    a second, and a different process state) for an unrelated helper; this loads just the module.
    """
    path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("modelpress._ort_symbolic_shape_infer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _symbolic(proto: onnx.ModelProto) -> tuple[onnx.ModelProto | None, str | None]:
    """ONNX Runtime's symbolic inference of ``proto``: (the inferred model or None, why not all).

    Its own ``infer_shapes`` writes ``sym_shape_infer_temp.onnx`` and a ``<uuid>.data`` file into
    the process's current folder whenever some shape stays unknown (models with com.microsoft ops
    do, routinely), then raises. This runs the same steps without that save, and returns the
    partial result: the shapes it did find are still worth having.
    """
    cls = _symbolic_shape_inference()
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 7:
        return None, f"opset {opset} is older than symbolic inference supports (7)"
    engine = cls(2**31 - 1, True, False, 0)  # int_max, auto_merge, guess_output_rank, verbose
    engine._preprocess(proto)
    complete = False
    while engine.run_:
        complete = engine._infer_impl()
    engine._update_output_from_vi()
    return engine.out_mp_, None if complete else "some shapes stay unknown"


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    # ONNX's own inference stops at shapes computed at run time (Shape→Gather→Concat→Reshape, as
    # exporters write them); ONNX Runtime's symbolic inference follows them through, so it goes
    # first, and ONNX's is the fallback for the models it refuses. Both are aids: a model neither
    # handles keeps the shapes it declares, and the reason is logged (``modelpress.ir.shapes``).
    try:
        inferred, incomplete = _symbolic(proto)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - its failures are of any type (sympy, KeyError, ...)
        inferred, incomplete = None, f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    if inferred is not None and incomplete is None:
        return inferred
    log.debug("symbolic shape inference: %s; using ONNX's", incomplete)
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001
        log.debug(
            "ONNX shape inference failed too (%s): shapes stay as declared", str(exc).strip()[:200]
        )
        return proto


def ensure_types(model: ir.Model) -> None:
    """``infer_types(model)`` when some node output has no dtype.

    Rules that compare dtypes or shapes need them on intermediate values, which files often omit.
    """
    if any(
        out.type is None for node in iter_nodes(model.graph) for out in node.outputs if out.name
    ):
        infer_types(model)


def infer_types(model: ir.Model) -> None:
    """ONNX shape inference (with data propagation), merged into ``model`` in place, best effort.

    A value takes the inferred type when it has none, and the inferred shape when that knows at
    least as many static dimensions; graph inputs and outputs keep what they declare, so dynamic
    dimensions stay dynamic and keep their names. (onnx_ir's ShapeInferencePass merges only the
    element dtype, which turns a sequence or optional value into a tensor.)
    """
    try:
        with _light(model) as proto:
            inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is an aid; a model it cannot handle stays as it is
        return
    types: dict[str, onnx.TypeProto] = {}
    stack = [inferred.graph]
    while stack:
        g = stack.pop()
        for info in list(g.value_info) + list(g.output):
            types[info.name] = info.type
        for node in g.node:
            for attr in node.attribute:
                stack.extend([attr.g] if attr.HasField("g") else list(attr.graphs))
    for graph in iter_graphs(model.graph):
        for node in graph:
            for value in node.outputs:
                proto = types.get(value.name) if value.name else None
                if proto is None or not proto.WhichOneof("value"):
                    continue
                if value.type is None:
                    value.type = ir.serde.deserialize_type_proto_for_type(proto)
                shape = ir.serde.deserialize_type_proto_for_shape(proto)
                # A graph output keeps the shape it declares (its dimension names are interface).
                if value.is_graph_output() and value.shape is not None:
                    continue
                if shape is not None and _more_static(shape, value.shape):
                    value.shape = shape


def _more_static(new: ir.Shape, old: ir.Shape | None) -> bool:
    if old is None:
        return True
    if len(new) != len(old):
        return False
    count = lambda s: sum(isinstance(d, int) for d in s)  # noqa: E731
    return count(new) >= count(old) and new != old


# Initializers larger than this are left out of the protobuf handed to ONNX's inference (it only
# needs their types and shapes, which they keep as graph inputs).
_LIGHT_BYTES = 1024


@contextmanager
def _light(model: ir.Model) -> Iterator[onnx.ModelProto]:
    """``model`` serialized without the data of its large initializers, which become typed graph
    inputs for the call; ``model`` is restored as it was, whatever happens inside."""
    graph = model.graph
    inputs = list(graph.inputs)
    big = [
        v
        for v in graph.initializers.values()
        if v.const_value is not None and v.const_value.nbytes > _LIGHT_BYTES
    ]
    kept = {v.name: v.const_value for v in big}
    try:
        for v in big:
            v.shape = v.shape or v.const_value.shape
            v.dtype = v.dtype or v.const_value.dtype
            graph.initializers.pop(v.name)
            v.const_value = None
            if not v.is_graph_input():
                graph.inputs.append(v)
        yield ir.serde.serialize_model(model)
    finally:
        graph.inputs.clear()
        graph.inputs.extend(inputs)
        for v in big:
            v.const_value = kept[v.name]
            graph.register_initializer(v)


def with_types(model: ir.Model) -> ir.Model:
    """``model`` with its values' types and shapes inferred (``infer_types``), for the rewrites
    that need element types on intermediate values. The same model object is returned."""
    infer_types(model)
    return model
