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
from modelpress.runtime.ort import session


def recalibrate(
    model: ir.Model, data: TrainData, *, batches: int = 8, batch_size: int = 64, seed: int = 0
) -> int:
    """Rewrite every BatchNormalization's mean and variance in ``model`` (in place) from the
    statistics of its input over ``batches`` batches of ``data``; returns the nodes updated.

    Nodes are measured in graph order, each with the statistics of the ones before it already
    replaced: a node's input depends on them (as in a training-mode forward pass). The statistics
    are fed as inputs of one ONNX Runtime session, so the model is loaded once.
    """

    nodes = [
        n
        for n in model.graph
        if n.op_type == "BatchNormalization"
        and len(n.inputs) >= 5
        and const_array(n.inputs[3]) is not None
        and const_array(n.inputs[4]) is not None
    ]
    if not nodes:
        return 0
    probe = copy_model(model)
    by_name = {n.name: n for n in probe.graph}
    stats: dict[str, np.ndarray] = {}
    fetch = []
    for i, node in enumerate(nodes):
        twin = by_name[node.name]
        for slot in (3, 4):
            array = const_array(twin.inputs[slot])
            name = f"__bn{i}_{slot}"
            value = ir.Value(
                name=name,
                type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
                shape=ir.Shape(array.shape),
            )
            probe.graph.inputs.append(value)
            twin.replace_input_with(slot, value)
            stats[name] = array
        x = twin.inputs[0]
        if x.type is None:
            x.type = ir.TensorType(ir.DataType.FLOAT)
        if not x.is_graph_output():
            probe.graph.outputs.append(x)
        fetch.append(x.name)
    sess = session(probe, optimize="disabled")
    sample = []
    for k, batch in enumerate(data.batches(batch_size, rng=np.random.default_rng(seed))):
        if k >= batches:
            break
        sample.append(batch.feeds)
    for i, node in enumerate(nodes):
        total = square = None
        count = 0
        for feeds in sample:
            x = np.asarray(sess.run([fetch[i]], {**feeds, **stats})[0], dtype=np.float64)
            axes = (0,) + tuple(range(2, x.ndim))
            s, q = x.sum(axis=axes), (x * x).sum(axis=axes)
            total = s if total is None else total + s
            square = q if square is None else square + q
            count += x.size // x.shape[1]
        if not count:
            continue
        mean = total / count
        var = np.maximum(square / count - mean**2, 0.0)
        for slot, array in ((3, mean), (4, var)):
            old = stats[f"__bn{i}_{slot}"]
            new = array.astype(old.dtype).reshape(old.shape)
            stats[f"__bn{i}_{slot}"] = new
            value = node.inputs[slot]
            if value.is_initializer() and len(value.uses()) == 1 and not value.is_graph_input():
                value.const_value = ir.tensor(new, name=value.name)
            else:
                node.replace_input_with(
                    slot, add_initializer(model.graph, new, f"{node.name}_stat{slot}")
                )
    return len(nodes)
