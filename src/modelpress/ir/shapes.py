"""Input shapes from the command line, and ONNX shape inference on the in-memory model."""

from __future__ import annotations

import functools

import onnx
import onnx_ir as ir

from modelpress.errors import OptionError


def parse_shapes(specs: list[str] | None) -> dict[str, tuple[int, ...]]:
    """Parse ``["input=1x3x224x224", "mask=1x128"]`` into ``{name: shape}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition("=")
        if not sep or not name:
            raise OptionError(f"--shape {spec!r}: expected NAME=D1xD2x..., e.g. input=1x3x224x224")
        try:
            shape = tuple(int(d) for d in dims.lower().split("x")) if dims else ()
        except ValueError:
            raise OptionError(f"--shape {spec!r}: dimensions must be integers joined by 'x'") from None
        if any(d < 0 for d in shape):
            raise OptionError(f"--shape {spec!r}: dimensions must not be negative")
        shapes[name] = shape
    return shapes


def parse_dims(specs: list[str] | None) -> dict[str, int]:
    """Parse ``["batch=8", "seq=128"]`` into sizes for named dynamic dimensions."""
    dims: dict[str, int] = {}
    for spec in specs or []:
        name, sep, value = spec.partition("=")
        if not sep or not name or not value.isdigit():
            raise OptionError(f"--dim {spec!r}: expected NAME=SIZE, e.g. batch=8")
        dims[name] = int(value)
    return dims


def infer_shapes(model: ir.Model, input_shapes: dict[str, tuple[int, ...]] | None = None) -> ir.Model:
    """Run ONNX shape inference (with data propagation), optionally with concrete input shapes.

    Returns a new model; the one given is not changed.
    """
    from modelpress.ir.io import from_proto, to_proto

    proto = to_proto(model)
    if input_shapes:
        known = {i.name for i in proto.graph.input}
        for name in input_shapes:
            if name not in known:
                raise OptionError(
                    f"--shape {name}=...: the model has no input {name!r} (inputs: {', '.join(sorted(known))})"
                )
        for inp in proto.graph.input:
            if inp.name in input_shapes:
                shape = input_shapes[inp.name]
                tshape = inp.type.tensor_type.shape
                if tshape.dim and len(tshape.dim) != len(shape):
                    raise OptionError(
                        f"--shape {inp.name}: rank {len(shape)} given, the model's input has rank {len(tshape.dim)}"
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
    import importlib.util
    from pathlib import Path

    import onnxruntime

    path = Path(onnxruntime.__file__).parent / "tools" / "symbolic_shape_infer.py"
    spec = importlib.util.spec_from_file_location("modelpress._ort_symbolic_shape_infer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SymbolicShapeInference


def _infer(proto: onnx.ModelProto) -> onnx.ModelProto:
    # ONNX's own inference stops at shapes computed at run time (Shape→Gather→Concat→Reshape, as
    # exporters write them); ONNX Runtime's symbolic inference follows them through, so it goes
    # first, and ONNX's is the fallback for the models it refuses. Both are best-effort.
    try:
        return _symbolic_shape_inference().infer_shapes(proto, auto_merge=True)
    except Exception:  # noqa: BLE001
        pass
    try:
        return onnx.shape_inference.infer_shapes(proto, data_prop=True)
    except Exception:  # noqa: BLE001
        return proto
