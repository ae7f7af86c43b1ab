"""PyTorch to ONNX: ``nn.Module`` objects, ``torch.export`` programs (``.pt2``), TorchScript (``.pt``).

The exporter is the one that ships with torch, ``torch.onnx.export``:
- modules and ``.pt2`` programs go through ``torch.export`` and the dynamo exporter (onnxscript),
  which turns ``torch.cond`` into ONNX ``If`` and keeps dynamic dimensions symbolic;
- a module that ``torch.export`` cannot trace, and every TorchScript module (``torch.export`` cannot
  read TorchScript), goes through the TorchScript-based exporter (``dynamo=False``), which turns
  scripted loops and branches into ``Loop``/``If``. The result's notes say which exporter ran.

An unsupported op becomes one line naming the op, the node and module it sits in, the source line
that produced it, and what to try.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import re
import sys
import warnings
from pathlib import Path

import numpy as np

from modelpress.convert.base import (
    ConversionError,
    ConvertOptions,
    Exported,
    first_line,
    reading,
)
from modelpress.errors import OptionError, require
from modelpress.ir import from_proto
from modelpress.ir.stats import iter_graphs

# The TorchScript-based exporter's default: new enough for LayerNormalization, old enough for
# every runtime; the dynamo exporter picks its own default (and needs at least 18).
LEGACY_DEFAULT_OPSET = 17


def _torch():
    return require("torch", extra="torch", purpose="converting a PyTorch model")


@contextlib.contextmanager
def _quiet():
    """Silence the exporters' progress prints, warnings and logs: a library does not print."""
    # torch sets levels on many of its own loggers (torch.onnx, symbolic_shapes, ...), so raising
    # one parent's level does not silence them; a process-wide threshold, restored after, does.
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        # torch.export also prints the graph it failed on straight to stderr.
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(previous)


def is_module(source: object) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(source, torch.nn.Module)


# ---------------------------------------------------------------------------------------------
# inputs: example arguments <-> ONNX feeds


def _split_example(module, options: ConvertOptions) -> tuple[tuple, dict]:
    torch = _torch()
    example = options.example_inputs
    if example is None and options.inputs:
        # Shapes alone: random tensors, in the order of forward's parameters.
        params = _forward_params(module)
        missing = [p for p in params if p not in options.inputs]
        unknown = [n for n in options.inputs if n not in params]
        if missing or unknown:
            raise OptionError(
                f"inputs: {type(module).__name__}.forward takes {', '.join(params)}; "
                f"got shapes for {', '.join(options.inputs)}"
            )
        gen = torch.Generator().manual_seed(0)
        return tuple(_random_tensor(options.inputs[p], gen) for p in params), {}
    if example is None:
        raise OptionError(
            "converting an nn.Module needs example_inputs (a tensor, a tuple of tensors, or a dict) "
            "or inputs={name: shape}"
        )
    if isinstance(example, torch.Tensor):
        return (example,), {}
    if isinstance(example, dict):
        return (), dict(example)
    return tuple(example), {}


def _forward_params(module) -> list[str]:
    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        return [a.name for a in module.forward.schema.arguments[1:]]  # [0] is self
    return list(inspect.signature(module.forward).parameters)


def _random_tensor(spec, gen):
    torch = _torch()
    dtype = getattr(torch, spec.dtype)
    if dtype.is_floating_point:
        return torch.randn(spec.shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.rand(spec.shape, generator=gen) > 0.5
    return torch.randint(0, 2, spec.shape, generator=gen, dtype=dtype)


class _Feeder:
    """Maps ONNX feeds (by input name, in graph order) back onto the module's (args, kwargs)."""

    def __init__(self, args: tuple, kwargs: dict):
        torch = _torch()
        self._flat, self._spec = torch.utils._pytree.tree_flatten((args, kwargs))
        self._tensor_at = [i for i, v in enumerate(self._flat) if isinstance(v, torch.Tensor)]

    @property
    def tensors(self) -> list:
        return [self._flat[i] for i in self._tensor_at]

    def call_args(self, feeds: dict[str, np.ndarray], names: list[str]) -> tuple[tuple, dict]:
        torch = _torch()
        if len(names) != len(self._tensor_at):
            raise ConversionError(
                f"the ONNX model has {len(names)} inputs but the example has {len(self._tensor_at)} tensors"
            )
        flat = list(self._flat)
        for i, name in zip(self._tensor_at, names, strict=False):
            flat[i] = torch.from_numpy(np.ascontiguousarray(feeds[name]))
        return torch.utils._pytree.tree_unflatten(flat, self._spec)


def _outputs_to_numpy(out) -> list[np.ndarray]:
    torch = _torch()
    leaves = torch.utils._pytree.tree_flatten(out)[0]
    return [t.detach().cpu().numpy() for t in leaves if isinstance(t, torch.Tensor)]


def _make_reference(call, feeder: _Feeder, names: list[str]):
    torch = _torch()

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        args, kwargs = feeder.call_args(feeds, names)
        with torch.no_grad():
            return _outputs_to_numpy(call(*args, **kwargs))

    return reference


def _graph_inputs(model) -> list[str]:
    return [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]


# ---------------------------------------------------------------------------------------------
# exporters


def _from_proto_bytes(data: bytes):
    import onnx

    return from_proto(onnx.ModelProto.FromString(data))


def _dynamo(ep, opset: int | None, optimize: bool = True):
    """ONNX from an ExportedProgram with the dynamo exporter; ConversionError explains failures."""
    torch = _torch()
    kwargs = {"dynamo": True, "verbose": False, "optimize": optimize}
    if opset is not None:
        kwargs["opset_version"] = opset
    try:
        with _quiet():
            program = torch.onnx.export(ep, **kwargs)
    except Exception as exc:  # the exporter raises many types; each becomes one line
        raise ConversionError(_explain_dynamo_error(exc, ep, opset)) from None
    return _from_proto_bytes(program.model_proto.SerializeToString())


def _name_dynamic_dims(model, dynamic: dict[str, tuple[int, ...]]) -> None:
    """Rename the exporter's symbols (``s77``) of the asked-for axes to ``<input>_<axis>``.

    The TorchScript-based exporter already uses these names; one naming keeps ``--dim x_0=8``
    the same whichever exporter ran. A symbol shared by several inputs takes the first one's name.
    """
    import onnx_ir as ir

    rename: dict[str, str] = {}
    for value in model.graph.inputs:
        for axis in dynamic.get(value.name, ()):
            dim = value.shape[axis] if value.shape is not None else None
            if dim is not None and not isinstance(dim, int) and dim.value:
                rename.setdefault(dim.value, f"{value.name}_{axis}")
    if not rename:
        return

    def fix(value) -> None:
        if value is not None and value.shape is not None:
            dims = [
                ir.SymbolicDim(rename[d.value])
                if not isinstance(d, int) and d.value in rename
                else d
                for d in value.shape
            ]
            value.shape = ir.Shape(dims)

    for graph in iter_graphs(model.graph):
        for value in (*graph.inputs, *graph.outputs):
            fix(value)
        for node in graph:
            for value in node.outputs:
                fix(value)


def _legacy(
    module,
    args: tuple,
    kwargs: dict,
    names: list[str],
    dynamic,
    opset: int | None,
    optimize: bool = True,
):
    """ONNX with the TorchScript-based exporter (the only one that reads TorchScript)."""
    torch = _torch()
    buf = io.BytesIO()
    axes = {n: {a: f"{n}_{a}" for a in dynamic.get(n, ())} for n in names if n in dynamic}
    export_args = args + (kwargs,) if kwargs else args
    try:
        with _quiet():
            torch.onnx.export(
                module,
                export_args,
                buf,
                dynamo=False,
                input_names=names,
                dynamic_axes=axes or None,
                opset_version=opset or LEGACY_DEFAULT_OPSET,
                do_constant_folding=optimize,
            )
    except Exception as exc:
        raise ConversionError(_explain_legacy_error(exc, opset or LEGACY_DEFAULT_OPSET)) from None
    return _from_proto_bytes(buf.getvalue())


_NO_FUNCTION = re.compile(
    r"No ONNX function found for <OpOverload\(op='([^']+)', overload='([^']+)'\)>"
)
_NODE = re.compile(r"Error when translating node %(\S+)")
_LEGACY_OP = re.compile(
    r"Exporting the operator '([^']+)' to ONNX opset version (\d+) is not supported"
)


def _full_text(exc: BaseException) -> str:
    parts = []
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    return re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(parts))


def _node_location(ep, node_name: str) -> str:
    """'node %x in module 'blocks.0.lin' (Linear), model.py:12', from the FX node's metadata."""
    where = [f"node %{node_name}"]
    node = (
        next((n for n in ep.graph.nodes if n.name == node_name), None) if ep is not None else None
    )
    if node is not None:
        stack = node.meta.get("nn_module_stack") or {}
        if stack:
            path, cls = list(stack.values())[-1]
            cls_name = cls if isinstance(cls, str) else getattr(cls, "__name__", str(cls))
            where.append(f"in module '{path}' ({cls_name.rsplit('.', 1)[-1]})")
        trace = node.meta.get("stack_trace") or ""
        frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
        if frames:
            file, line = frames[-1]
            where.append(f"at {Path(file).name}:{line}")
    return " ".join(where)


def _explain_dynamo_error(exc: BaseException, ep, opset: int | None) -> str:
    text = _full_text(exc)
    node = _NODE.search(text)
    where = _node_location(ep, node.group(1)) if node else "the exported program"
    missing = _NO_FUNCTION.search(text)
    if missing:
        op = missing.group(1)
        at = f"opset {opset}" if opset else "the default opset"
        return (
            f"unsupported op {op} ({where}): the ONNX exporter has no translation for it at {at}; "
            "try a newer `opset`, register an ONNX function for it "
            "(torch.onnx.export(custom_translation_table=...)), or export it as a custom op"
        )
    summary = re.search(r"## Exception summary\s*\n+\s*(.+)", text)
    line = summary.group(1).strip() if summary else first_line(exc)
    return f"the ONNX exporter failed on {where}: {line[:300]}"


def _explain_legacy_error(exc: BaseException, opset: int) -> str:
    text = _full_text(exc)
    m = _LEGACY_OP.search(text)
    if m:
        return (
            f"unsupported op {m.group(1)} at opset {m.group(2)} (TorchScript-based exporter): "
            "try a newer `opset`, a torch.export-able module (dynamo exporter), or register a "
            "custom symbolic (torch.onnx.register_custom_op_symbolic)"
        )
    return f"the TorchScript-based ONNX exporter failed: {first_line(exc)}"


# ---------------------------------------------------------------------------------------------
# source kinds


def _param_names(module, args: tuple, kwargs: dict) -> list[str]:
    """Names of the module's tensor arguments, the names its ONNX inputs get."""
    torch = _torch()
    if isinstance(module, torch.jit.ScriptModule):
        bound = dict(zip(_forward_params(module), args, strict=False)) | kwargs
    else:
        try:
            bound = dict(inspect.signature(module.forward).bind(*args, **kwargs).arguments)
        except TypeError as exc:
            raise OptionError(
                f"example_inputs do not match {type(module).__name__}.forward: {exc}"
            ) from None
    names = []
    for name, value in bound.items():
        leaves = torch.utils._pytree.tree_flatten(value)[0]
        tensors = [v for v in leaves if isinstance(v, torch.Tensor)]
        names += [name] if len(tensors) == 1 else [f"{name}_{i}" for i in range(len(tensors))]
    return names


def _check_dynamic_names(dynamic: dict, names: list[str]) -> None:
    for name in dynamic:
        if name not in names:
            raise OptionError(
                f"`dynamic` {name}:...: the model has no input {name!r} (inputs: {', '.join(names)})"
            )


def _dynamic_shapes(module, args, kwargs, dynamic: dict):
    """``dynamic_shapes`` for torch.export, keyed by forward's parameter names."""
    torch = _torch()
    if not dynamic:
        return None
    bound = inspect.signature(module.forward).bind(*args, **kwargs).arguments
    return {
        name: ({a: torch.export.Dim.DYNAMIC for a in dynamic[name]} if name in dynamic else None)
        for name in bound
    }


def _shapes(names: list[str], tensors: list) -> dict[str, tuple[int, ...]]:
    return {n: tuple(int(d) for d in t.shape) for n, t in zip(names, tensors, strict=False)}


def _example_feeds(names: list[str], tensors: list) -> dict[str, np.ndarray]:
    return {n: t.detach().cpu().numpy() for n, t in zip(names, tensors, strict=False)}


def convert_module(module, options: ConvertOptions) -> Exported:
    torch = _torch()
    args, kwargs = _split_example(module, options)
    module.eval()
    feeder = _Feeder(args, kwargs)
    names = _param_names(module, args, kwargs)
    _check_dynamic_names(options.dynamic, names)
    notes: list[str] = []

    def legacy():
        return _legacy(
            module,
            args,
            kwargs,
            names,
            options.dynamic,
            options.opset,
            options.exporter_optimizations,
        )

    if isinstance(module, torch.jit.ScriptModule):
        notes.append("TorchScript module: converted with the TorchScript-based exporter")
        model, exporter = legacy(), "torchscript"
    else:
        try:
            with _quiet():
                ep = torch.export.export(
                    module,
                    args,
                    kwargs,
                    dynamic_shapes=_dynamic_shapes(module, args, kwargs, options.dynamic),
                    strict=False,
                )
        except Exception as exc:  # torch.export raises many kinds; the fallback may still work
            notes.append(
                f"torch.export could not trace the model ({first_line(exc, 200)}); "
                "used the TorchScript-based exporter"
            )
            ep = None
        if ep is None:
            model, exporter = legacy(), "torchscript"
        else:
            try:
                model = _dynamo(ep, options.opset, options.exporter_optimizations)
                _name_dynamic_dims(model, options.dynamic)
                exporter = "dynamo"
            except ConversionError as dynamo_error:
                try:
                    model = legacy()
                except ConversionError:
                    raise ConversionError(
                        f"{dynamo_error} (the TorchScript-based exporter failed too)"
                    ) from None
                notes.append(
                    f"the dynamo exporter failed ({dynamo_error}); used the TorchScript-based exporter"
                )
                exporter = "torchscript"
    onnx_names = _graph_inputs(model)
    return Exported(
        model=model,
        reference=_make_reference(module, feeder, onnx_names),
        shapes=_shapes(onnx_names, feeder.tensors),
        exporter=exporter,
        example_feeds=_example_feeds(onnx_names, feeder.tensors)
        if options.example_inputs is not None
        else None,
        notes=notes,
    )


def _example_from_program(ep, options: ConvertOptions, path: Path) -> tuple[tuple, dict]:
    """The program's saved example inputs, else tensors shaped like its placeholders."""
    torch = _torch()
    if options.inputs:
        specs = options.inputs
        names = list(ep.graph_signature.user_inputs)
        missing = [n for n in names if n not in specs]
        if missing:
            raise OptionError(
                f"{path}: `inputs` given, but not for {', '.join(missing)} (inputs: {', '.join(names)})"
            )
        gen = torch.Generator().manual_seed(0)
        return tuple(_random_tensor(specs[n], gen) for n in names), {}
    if ep.example_inputs is not None:
        return ep.example_inputs
    args = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in ep.graph_signature.user_inputs:
            val = node.meta.get("val")
            if val is None or not all(isinstance(d, int) or hasattr(d, "node") for d in val.shape):
                raise OptionError(
                    f"{path}: input {node.name!r} has no recorded shape; give `inputs` {node.name}=..."
                )
            shape = [d if isinstance(d, int) else int(d.node.hint or 2) for d in val.shape]
            args.append(torch.zeros(shape, dtype=val.dtype))
    return tuple(args), {}


def convert_pt2(path, options: ConvertOptions) -> Exported:
    torch = _torch()
    path = Path(path)
    if options.dynamic:
        raise OptionError(
            f"{path}: a .pt2 program's dynamic dimensions are fixed when it is exported "
            "(torch.export.export(..., dynamic_shapes=...)); `dynamic` cannot change them"
        )
    advice = "; save one with torch.export.save(torch.export.export(model, args), 'model.pt2')"
    with reading(path, "torch.export program", advice), _quiet():
        ep = torch.export.load(str(path))
    args, kwargs = _example_from_program(ep, options, path)
    model = _dynamo(ep, options.opset, options.exporter_optimizations)
    feeder = _Feeder(args, kwargs)
    onnx_names = _graph_inputs(model)
    module = ep.module()
    saved = (
        ep.example_inputs is not None and not options.inputs
    )  # real inputs saved with the program
    return Exported(
        model=model,
        reference=_make_reference(module, feeder, onnx_names),
        shapes=_shapes(onnx_names, feeder.tensors),
        exporter="dynamo",
        example_feeds=_example_feeds(onnx_names, feeder.tensors) if saved else None,
    )


def convert_torchscript(path, options: ConvertOptions) -> Exported:
    torch = _torch()
    path = Path(path)
    advice = (
        "; a state_dict or a pickled module cannot be converted: save with "
        "torch.jit.save(torch.jit.script(model), path) or torch.export.save(...) as .pt2"
    )
    with reading(path, "TorchScript file", advice), _quiet():
        module = torch.jit.load(str(path), map_location="cpu")
    params = _forward_params(module)
    missing = [n for n in params if n not in options.inputs]
    if missing:
        raise OptionError(
            f"{path}: a TorchScript file does not record input shapes; give `inputs` for "
            + ", ".join(f"{n}=D1xD2x..." for n in missing)
        )
    gen = torch.Generator().manual_seed(0)
    args = tuple(_random_tensor(options.inputs[n], gen) for n in params)
    _check_dynamic_names(options.dynamic, params)
    model = _legacy(
        module, args, {}, params, options.dynamic, options.opset, options.exporter_optimizations
    )
    feeder = _Feeder(args, {})
    onnx_names = _graph_inputs(model)
    return Exported(
        model=model,
        reference=_make_reference(module, feeder, onnx_names),
        shapes=_shapes(onnx_names, feeder.tensors),
        exporter="torchscript",
        notes=["TorchScript file: converted with the TorchScript-based exporter"],
    )
