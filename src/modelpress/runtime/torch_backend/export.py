"""Export a (trained) ``OnnxModule`` back to ONNX.

The module was built from a graph and training changes only the values of its parameters and
buffers, never the graph. So the export is a copy of the original model with every initializer
(in the main graph and in subgraphs) replaced by the module's current value, in the initializer's
original dtype: the result runs in any ONNX runtime and computes what the module computes.
"""

from __future__ import annotations

import onnx_ir as ir
import torch

from modelpress.ir import from_proto, to_proto
from modelpress.ir.stats import iter_graphs
from modelpress.runtime.torch_backend.module import OnnxModule


def to_onnx(module: OnnxModule) -> ir.Model:
    """A copy of ``module.model`` whose initializers hold the module's current values."""

    model = from_proto(to_proto(module.model))  # a deep copy; the module's model stays untouched
    for index, graph in enumerate(iter_graphs(model.graph)):
        for name, value in graph.initializers.items():
            attr = module.tensor_attrs.get((index, name))
            if attr is None:
                continue
            tensor: torch.Tensor = getattr(module, attr)
            value.const_value = ir.Tensor(tensor.detach().cpu().contiguous().numpy(), name=name)
    return model
