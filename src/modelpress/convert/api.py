"""``convert()``: any supported framework model in, verified standard ONNX out.

The steps: detect the source kind (``kinds.detect``), let its converter export the model, then run
the original framework and ONNX Runtime (its optimizations disabled) on the same inputs and compare
every output with the per-dtype tolerances of ``modelpress.verify``. The inputs are the user's
example inputs when given, random ones at the traced shapes, and, when the ONNX model has dynamic
dimensions, random ones at other sizes, so a dimension that only *looks* dynamic is caught.
A conversion that does not verify raises ``VerificationError`` (unless ``verify=False``) and writes
nothing. ``optimize=True`` runs ``modelpress.optimize`` (level 2) on the result and verifies the
optimized model against the original framework again.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.convert.base import ConvertOptions, Exported, InputSpec
from modelpress.convert.kinds import detect
from modelpress.convert.llm import LLMConvertResult, convert_llm
from modelpress.errors import ConversionError, OptionError, VerificationError
from modelpress.ir import from_proto, graph_stats, save, to_proto
from modelpress.passes import optimize as run_optimizer
from modelpress.runtime.ort import session
from modelpress.verify import OutputDiff, VerifyResult, compare_arrays, generate_inputs

SOURCE_METADATA_KEY = "modelpress.converted_from"


@dataclass
class ConvertResult:
    model: ir.Model  # the final model (optimized when asked)
    source_kind: str
    exporter: str
    verify: VerifyResult | None  # the converted model against the original framework
    notes: list[str] = field(default_factory=list)
    output: Path | None = None
    optimized: object | None = None  # modelpress.passes.optimize.OptimizeResult
    optimized_verify: VerifyResult | None = None
    nodes_converted: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {
            "source_kind": self.source_kind,
            "exporter": self.exporter,
            "output": str(self.output) if self.output else None,
            "verify": self.verify.to_dict() if self.verify else None,
            "optimize": self.optimized.to_dict() if self.optimized else None,
            "optimized_verify": self.optimized_verify.to_dict() if self.optimized_verify else None,
            "notes": self.notes,
            "seconds": round(self.seconds, 3),
        }


def _input_specs(inputs: Mapping | None) -> dict[str, InputSpec]:
    out = {}
    for name, spec in (inputs or {}).items():
        if isinstance(spec, InputSpec):
            out[name] = spec
        elif isinstance(spec, Sequence) and all(isinstance(d, int) for d in spec):
            out[name] = InputSpec(tuple(spec))
        else:
            raise OptionError(f"inputs[{name!r}]: expected a shape (tuple of ints), got {spec!r}")
    return out


def _dynamic_axes(dynamic: Mapping | None) -> dict[str, tuple[int, ...]]:
    out = {}
    for name, axes in (dynamic or {}).items():
        out[name] = (axes,) if isinstance(axes, int) else tuple(int(a) for a in axes)
    return out


def _verification_feeds(model: ir.Model, exported: Exported) -> list[dict[str, np.ndarray]]:
    feeds = []
    if exported.example_feeds:
        feeds.append(exported.example_feeds)
    feeds.append(generate_inputs(model, shapes=exported.shapes, seed=0))
    # Sizes of the named dynamic dimensions at trace time; the last run moves each one by +1.
    sizes: dict[str, int] = {}
    static_shapes = {}
    for value in model.graph.inputs:
        if value.shape is None or value.name not in exported.shapes:
            continue
        traced = exported.shapes[value.name]
        symbolic = False
        for dim, size in zip(value.shape, traced, strict=False):
            if not isinstance(dim, int):
                symbolic = True
                if dim.value:
                    sizes.setdefault(str(dim.value), size)
        if not symbolic:
            static_shapes[value.name] = traced
    if sizes:
        dims = {k: v + 1 for k, v in sizes.items()}
        feeds.append(generate_inputs(model, shapes=static_shapes, dims=dims, default_dim=3, seed=1))
    else:
        feeds.append(generate_inputs(model, shapes=exported.shapes, seed=1))
    return feeds


def verify_against_source(
    model: ir.Model,
    exported: Exported,
    feeds_list: list[dict[str, np.ndarray]],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> tuple[VerifyResult, list[str]]:
    """Compare ONNX Runtime's outputs of ``model`` with the original framework's, on each feed."""

    sess = session(model, optimize="disabled")
    names = [o.name for o in sess.get_outputs()]
    worst: dict[str, OutputDiff] = {}
    notes: list[str] = []
    runs = 0
    for i, feeds in enumerate(feeds_list):
        try:
            expected = exported.reference(feeds)
        except Exception as exc:  # the framework refused these sizes: only the last, varied run may
            if i < len(feeds_list) - 1:
                raise ConversionError(
                    f"the original model failed on the verification inputs: {exc}"
                ) from None
            notes.append(
                f"not verified at other sizes of the dynamic dimensions: the original model refused them ({str(exc).splitlines()[0][:120]})"
            )
            continue
        try:
            got = sess.run(names, feeds)
        except Exception as exc:  # ORT's own exception types
            raise VerificationError(
                f"the converted model fails under ONNX Runtime on inputs the original accepts "
                f"(shapes {', '.join(f'{k}={list(v.shape)}' for k, v in feeds.items())}): "
                f"{str(exc).strip().splitlines()[0][:200]}"
            ) from None
        if len(expected) != len(got):
            raise VerificationError(
                f"the converted model has {len(got)} outputs, the original returned {len(expected)}"
            )
        runs += 1
        for name, a, b in zip(names, expected, got, strict=False):
            d = compare_arrays(name, np.asarray(a), b, rtol=rtol, atol=atol)
            prev = worst.get(name)
            if prev is None or (not d.passed, d.max_rel) > (not prev.passed, prev.max_rel):
                worst[name] = d
    return VerifyResult(outputs=[worst[n] for n in names], runs=runs), notes


def _convert_llm(src, *, output, verify: bool, rtol, level: str, others: dict):
    given = [k for k, v in others.items() if v]
    if given:
        raise OptionError(
            f"`{given[0]}` does not apply to a decoder checkpoint (an LLM folder is written with "
            "`output`, `verify`, `rtol` and `level`)"
        )
    if output is None:
        raise OptionError(f"{src}: a decoder checkpoint needs `output` (the LLM folder to write)")
    return convert_llm(src, output=output, verify=verify, rtol=rtol, level=level)


def convert(
    src: object,
    *,
    output: str | os.PathLike | None = None,
    opset: int | None = None,
    inputs: Mapping[str, Sequence[int] | InputSpec] | None = None,
    dynamic: Mapping[str, int | Sequence[int]] | None = None,
    example_inputs: object = None,
    verify: bool = True,
    optimize: bool = False,
    rtol: float | None = None,
    atol: float | None = None,
    exporter_optimizations: bool = True,
    level: str = "standard",
) -> ConvertResult | LLMConvertResult:
    """Convert ``src`` to ONNX, verify it against the original framework, optionally optimize and save.

    ``src``: a path (``.pt2``, ``.pt``, SavedModel folder, ``.keras``, ``.h5``, ``.tflite``) or an
    in-memory ``torch.nn.Module`` (with ``example_inputs``) or ``keras.Model``.
    ``inputs``: shapes by input name (needed for TorchScript files; fixes open dims elsewhere).
    ``dynamic``: axes to keep dynamic, by input name (``{"x": 0}``).
    ``exporter_optimizations=False`` keeps the exporter from cleaning up its own graph (PyTorch
    only), so the ONNX model mirrors the source op for op (what ``optimize`` then improves).

    A decoder checkpoint (a Hugging Face folder or a ``.gguf`` file) becomes an LLM folder at
    ``output`` (``convert.llm.convert_llm``; ``level`` applies to it alone) and returns an
    ``LLMConvertResult``.
    """
    start = time.perf_counter()
    if opset is not None and not 7 <= opset <= 30:
        raise OptionError(f"`opset` {opset}: expected an ONNX opset between 7 and 30")
    if output is not None and not Path(output).resolve().parent.is_dir():
        raise OptionError(f"{output}: output directory {Path(output).parent} does not exist")
    kind = detect(src)
    if kind.llm:
        others = {"opset": opset, "inputs": inputs, "dynamic": dynamic, "optimize": optimize}
        others["example_inputs"] = example_inputs is not None
        others["atol"] = atol is not None
        return _convert_llm(
            src, output=output, verify=verify, rtol=rtol, level=level, others=others
        )
    options = ConvertOptions(
        opset=opset,
        inputs=_input_specs(inputs),
        dynamic=_dynamic_axes(dynamic),
        example_inputs=example_inputs,
        exporter_optimizations=exporter_optimizations,
    )
    exported = kind.convert(src, options)
    model = exported.model
    model.metadata_props[SOURCE_METADATA_KEY] = kind.name
    notes = list(exported.notes)
    result = ConvertResult(
        model=model, source_kind=kind.name, exporter=exported.exporter, verify=None, notes=notes
    )

    result.nodes_converted = graph_stats(model).node_count
    feeds = _verification_feeds(model, exported) if verify else []
    if verify:
        result.verify, more = verify_against_source(model, exported, feeds, rtol=rtol, atol=atol)
        notes += more
        result.verify.raise_if_failed("the ONNX model and the original")
    if optimize:
        # optimize() rewrites in place; keep the converted model intact for the result and errors.
        opt = run_optimizer(from_proto(to_proto(model)), level=2)
        result.optimized = opt
        if verify:
            result.optimized_verify, _ = verify_against_source(
                opt.model, exported, feeds, rtol=rtol, atol=atol
            )
            result.optimized_verify.raise_if_failed("the optimized ONNX model and the original")
        result.model = opt.model
    if output is not None:
        result.output = save(result.model, output)
    result.seconds = time.perf_counter() - start
    return result
