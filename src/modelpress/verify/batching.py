"""Whether a model may be batched, decided once, by evidence: the one decision ``serve`` and
``run`` both use.

Reading the graph (``runtime.batch.split.batch_rule``) proves some models per-sample, but misses
many real exports (TorchScript and tf2onnx name the batch differently in every input and output,
shape inference gives up on an obfuscated or control-flow graph) and costs a symbolic shape
inference over the whole graph. So, when the model can be run:

1. a model's own say (``metadata_props["modelpress.batch"]``) or the caller's ``override``
   (``per-sample`` / ``whole``) wins;
2. the inputs must carry a batch on axis 0 (all dynamic there, or all one fixed size; a fixed 1
   is one sample a run), and no op may look at the whole tensor (NonMaxSuppression, NonZero...);
3. evidence: two single samples the model runs on (generated to fit, ``verify.fit``) are run one
   at a time and then joined into a batch of two; the model is per-sample when every output of the
   batch has 2 rows along axis 0 and row ``i`` equals the single run ``i`` (within float rounding:
   ``rtol`` 1e-3 on the output's scale, as kernels for other batch sizes sum in another order).

Without a way to run the model, the graph rule decides.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from modelpress.errors import ModelpressError, OptionError
from modelpress.ir.dims import static_dim

if TYPE_CHECKING:
    import onnx_ir as ir

    from modelpress.runtime.batch.split import BatchRule

# (the graph's tools are imported by the functions: the command line reads OVERRIDES for its
# choices, and a server of LLM folders alone never loads onnx_ir)
OVERRIDES = ("auto", "per-sample", "whole")
Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

RTOL = 1e-3


def decide_batching(
    model: ir.Model, run: Runner | None = None, *, override: str | None = None
) -> BatchRule:
    """How ``model`` may be batched (see the module docstring); ``run(feeds) -> outputs``."""
    import onnx_ir as ir

    from modelpress.runtime.batch.split import METADATA_KEY, WHOLE_TENSOR_OPS, BatchRule, batch_rule

    if override not in (None, "auto"):
        if override not in OVERRIDES:
            raise OptionError(f"`batching` {override!r}: choose one of {', '.join(OVERRIDES)}")
        per = override == "per-sample"
        return BatchRule(per, None, "" if per else "batching was set to whole")
    said = model.metadata_props.get(METADATA_KEY)
    if said in ("per-sample", "whole") or run is None:
        return batch_rule(model)
    g = model.graph
    inputs = [v for v in g.inputs if v.name not in g.initializers]
    if not inputs:
        return BatchRule(False, None, "the model has no inputs")
    for v in inputs:
        if v.shape is None or len(v.shape) == 0:
            return BatchRule(False, None, f"input {v.name!r} has no batch axis")
    fixed = {static_dim(v.shape[0]) for v in inputs}
    if fixed != {None}:
        return batch_rule(model)  # a fixed batch: the graph decides, there is nothing to join
    for node in ir.traversal.RecursiveGraphIterator(g):
        if node.op_type in WHOLE_TENSOR_OPS and node.domain in ("", "ai.onnx"):
            return BatchRule(False, None, f"{node.op_type} {node.name!r} works on the whole batch")
    return _evidence(model, run)


def _evidence(model: ir.Model, run: Runner) -> BatchRule:
    import onnx_ir as ir

    from modelpress.runtime.batch.split import BatchRule
    from modelpress.verify.fit import fit_inputs

    names = [v.name for v in model.graph.inputs if v.name not in model.graph.initializers]
    leading = {
        v.shape[0].value for v in model.graph.inputs if isinstance(v.shape[0], ir.SymbolicDim)
    }
    try:
        fitted = fit_inputs(model, run, dims={n: 1 for n in leading if n}, input_sets=2, seed=7)
    except ModelpressError as exc:
        return BatchRule(False, None, f"it could not be run on generated inputs ({exc})")
    singles = [{k: feeds[k][:1] for k in names} for feeds in fitted.feeds]
    if any(a.shape[0] != 1 for s in singles for a in s.values()):
        return BatchRule(False, None, "an input has no sample to take along axis 0")
    joined = {k: np.concatenate([singles[0][k], singles[1][k]]) for k in names}
    try:
        one = [run(s) for s in singles]
        both = run(joined)
    except Exception as exc:  # noqa: BLE001 - any runtime's refusal: a batch of 2 does not run
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return BatchRule(False, None, f"samples do not run alone and as a batch of 2 ({first})")
    for name, out in both.items():
        if out.ndim == 0 or out.shape[0] != 2:
            return BatchRule(
                False, None, f"output {name!r} has no row per sample (shape {list(out.shape)})"
            )
        for i in range(2):
            want = one[i][name]
            got = out[i : i + 1]
            if want.shape != got.shape or not _close(got, want):
                return BatchRule(
                    False, None, f"output {name!r} of a batch of 2 differs from two single runs"
                )
    return BatchRule(True, None, "")


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind not in "fc":
        return bool(np.array_equal(a, b))
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    return bool(np.allclose(a, b, rtol=RTOL, atol=RTOL * max(scale, 1e-6), equal_nan=True))
