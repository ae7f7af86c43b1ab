"""``optimize_verified()``: optimize a model, check the result against the original, then save it.

What ``modelpress optimize`` does, as one library call: the optimized model is compared with the
original on inputs fitted to it (``modelpress.verify``), and it is written only when the check
passes (or was not asked for). The original model is not changed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir

from modelpress.ir import graph_stats, model_bytes, save
from modelpress.ir.files import output_dir
from modelpress.ir.graph import copy_model
from modelpress.passes.optimize import OptimizeResult, optimize
from modelpress.verify import VerifyResult, verify


@dataclass
class VerifiedOptimize:
    """An optimization, what it changed in size, and its check against the original."""

    optimized: OptimizeResult
    nodes_before: int
    nodes_after: int
    bytes_before: int
    bytes_after: int
    verify: VerifyResult | None  # None when the check was not asked for
    output: Path | None = None

    @property
    def model(self) -> ir.Model:
        return self.optimized.model

    @property
    def passed(self) -> bool:
        return self.verify is None or self.verify.passed

    def to_dict(self) -> dict:
        return {
            **self.optimized.to_dict(),
            "nodes_before": self.nodes_before,
            "nodes_after": self.nodes_after,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
            "verify": self.verify.to_dict() if self.verify else None,
            "output": str(self.output) if self.output else None,
        }


def _size(model: ir.Model) -> int:
    try:
        return len(model_bytes(model))
    except ValueError:  # past protobuf's 2 GiB: count the initializers instead
        return sum(
            v.const_value.nbytes
            for v in model.graph.initializers.values()
            if v.const_value is not None
        )


def optimize_verified(
    model: ir.Model,
    *,
    output: str | os.PathLike | None = None,
    level: int = 2,
    passes: list[str] | None = None,
    skip: list[str] | None = None,
    opset: int | None = None,
    check: bool = True,
    verify_options: Mapping[str, Any] | None = None,
    external_data: bool | None = None,
) -> VerifiedOptimize:
    """Optimize a copy of ``model`` (``passes.optimize``), verify it against ``model`` (unless
    ``check=False``) and, when it passes, save it to ``output``.

    A failed check raises ``VerificationError`` and writes nothing. ``level``, ``passes``,
    ``skip`` and ``opset`` are ``optimize``'s options; ``verify_options``, the keyword arguments of
    ``verify`` (``data``, ``dims``, ``shapes``, ``input_sets``, ``rtol``, ``atol``, ...).
    """
    if output is not None:
        output_dir(output)  # a missing folder is reported before the work, not after
    before = graph_stats(model)
    bytes_before = _size(model)
    result = optimize(copy_model(model), level=level, passes=passes, skip=skip, opset=opset)
    checked = None
    if check:
        checked = verify(model, result.model, **(verify_options or {}))
    report = VerifiedOptimize(
        optimized=result,
        nodes_before=before.node_count,
        nodes_after=graph_stats(result.model).node_count,
        bytes_before=bytes_before,
        bytes_after=_size(result.model),
        verify=checked,
    )
    if output is not None and report.passed:
        report.output = save(result.model, output, external_data=external_data)
    return report
