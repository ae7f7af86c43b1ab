"""BatchNorm statistics measured again on the training data.

Removing channels changes what the next layers see, so the running mean and variance a
BatchNormalization node holds no longer describe its input (and the PyTorch backend trains with
those statistics frozen). ``recalibrate(model, data)`` runs the model on training batches under
ONNX Runtime, measures each BatchNormalization input's per-channel mean and variance, and writes
them as the node's statistics: the pruned network then normalizes its features as its own data
asks (the "BN recalibration" of the pruning literature, e.g. EagleEye, Li et al. 2020).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from modelpress.compress.train.data import TrainData
from modelpress.ir.graph import add_initializer, copy_model
from modelpress.ir.match import const_array


def recalibrate(model: ir.Model, data: TrainData, *, batches: int = 16, batch_size: int = 64, seed: int = 0) -> int:
    """Rewrite every BatchNormalization's mean and variance in ``model`` (in place) from the
    statistics of its input over ``batches`` batches of ``data``; returns the nodes updated."""
    from modelpress.runtime.ort import session

    nodes = [
        n for n in model.graph
        if n.op_type == "BatchNormalization" and len(n.inputs) >= 5
        and const_array(n.inputs[3]) is not None and const_array(n.inputs[4]) is not None
    ]
    if not nodes:
        return 0
    probe = copy_model(model)
    by_name = {n.name: n for n in probe.graph}
    fetch = []
    for node in nodes:
        x = by_name[node.name].inputs[0]
        if x.type is None:
            x.type = ir.TensorType(ir.DataType.FLOAT)
        if not x.is_graph_output():
            probe.graph.outputs.append(x)
        fetch.append(x.name)
    sess = session(probe, optimize="disabled")
    sums = [None] * len(nodes)
    squares = [None] * len(nodes)
    count = [0] * len(nodes)
    rng = np.random.default_rng(seed)
    for k, batch in enumerate(data.batches(batch_size, rng=rng)):
        if k >= batches:
            break
        values = sess.run(fetch, batch.feeds)
        for i, x in enumerate(values):
            x = np.asarray(x, dtype=np.float64)
            axes = (0,) + tuple(range(2, x.ndim))
            s, q = x.sum(axis=axes), (x * x).sum(axis=axes)
            sums[i] = s if sums[i] is None else sums[i] + s
            squares[i] = q if squares[i] is None else squares[i] + q
            count[i] += x.size // x.shape[1]
    for i, node in enumerate(nodes):
        if not count[i]:
            continue
        mean = sums[i] / count[i]
        var = np.maximum(squares[i] / count[i] - mean**2, 0.0)
        for slot, array in ((3, mean), (4, var)):
            old = const_array(node.inputs[slot])
            new = array.astype(old.dtype).reshape(old.shape)
            value = node.inputs[slot]
            if value.is_initializer() and len(value.uses()) == 1 and not value.is_graph_input():
                value.const_value = ir.tensor(new, name=value.name)
            else:
                node.replace_input_with(slot, add_initializer(model.graph, new, f"{node.name}_stat{slot}"))
    return len(nodes)
