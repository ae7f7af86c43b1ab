"""Weight mixing (runtime mode): every layer that carries a weight computes in a secret channel
order, and the order is put back only where the graph needs it (the graph's outputs, mostly),
by values the runtime supplies.

The rule (``channels.py`` finds where it applies). Each *group* of activations that share a
channel axis gets a random derangement ``q`` of its ``n`` channels; stored channel ``j`` holds
original channel ``q[j]``:

    producer:   S = take(W, q, output axis), bias' = bias[q]     (Conv, MatMul, Gemm, embedding)
    in between: per-channel constants (BatchNorm, a bias Add, LayerNorm's scale and shift, a
                depthwise Conv's filters) are taken by ``q`` too; ReLU, Clip, pooling, Add of
                two tensors of one group, ... need nothing: no operator is added between layers
    consumer:   S' = take(W', q, input axis)                     (the next Conv, MatMul, Gemm)
    boundary:   y = Gather(z, idx, axis), idx = q^-1 a graph input supplied at run time

A large embedding table also has its rows deranged and sign-flipped (``S[r] = s[r] W[p[r]]``):
the ids go through ``p^-1`` and the looked-up rows are multiplied by their sign, both supplied at
run time. A layer the groups do not reach keeps the per-layer rule (``_conv``, ``_matmul``,
``_gemm``, ``_embedding``): its output gathered back and sign-flipped by run-time values after
it, its input sign-flipped before it.

Exactness: a permutation changes no value, only the order in which a layer adds its products
(the input axis of a consumer): outputs agree with the original's to float rounding.

What the file gives back, and what it does not: a tensor of the file is an original weight in a
secret channel order (both axes permuted where the layer reads and writes a group). Its Pearson
correlation with the original weight, in any axis order, is at the chance level for its size
(tested against ONNX Runtime's optimizer, the ONNX inliner, onnxsim and onnxslim, which fold
BatchNorm into the convolutions: ``tests/protect/test_recovery.py``). The orders between two
layers are nowhere in the file or the library: nothing needs them. But a network in another
channel order computes the same function (the permutation symmetry of neural networks): whoever
holds the key and runs the model holds a functionally equal network, as anyone who can query it
enough could distil one; what the file keeps from them is the original tensors themselves.
Constant folding cannot undo a boundary either: its indices are graph inputs, with no value in
the file.

Preconditions: the node is in the main graph, in the default domain; its weight is constant.
The per-layer rule needs a float weight of at least ``MIN_ELEMENTS`` elements read by that node
alone, Gemm's bias absent or one-dimensional, a Gather of a two-dimensional table on axis 0.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from modelpress.protect import channels
from modelpress.protect.compress_graph import is_constant
from modelpress.protect.correlation import standardized, views

# Below this, a shuffled tensor correlates with the original (or another weight) by chance alone
# more than the file's metric allows (|r| < 0.05: chance is 1/sqrt(n)); smaller weights get noise.
MIN_ELEMENTS = 16384
# the orders are drawn among this many candidates per group, scored on the weights whose size is
# in SCORED_ELEMENTS (smaller ones are at the chance level anyway; larger ones cost too much)
CANDIDATES = (4, 16)
TARGET_Z = 3.5  # the largest |r| * sqrt(n) over the pairs scored: chance for a few thousand pairs
SCORED_ELEMENTS = (256, 1 << 20)
CROSS_ELEMENTS = 1 << 16  # weights up to this size are also scored against every same-size one
_FLOATS = {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.DOUBLE, ir.DataType.BFLOAT16}


def _rng(seed: str, part: str) -> np.random.Generator:
    digest = hashlib.sha256(bytes.fromhex(seed) + part.encode()).digest()
    return np.random.default_rng(np.frombuffer(digest, dtype=np.uint64))


def derangement(seed: str, n: int, block: int, part: str = "q") -> np.ndarray:
    """A permutation of ``range(n)`` that maps each block of ``block`` indices onto itself with
    no fixed point (one random cycle per block; a block of one is left in place)."""
    rng = _rng(seed, part)
    q = np.arange(n, dtype=np.int64)
    for start in range(0, n, block):
        size = min(block, n - start)
        if size < 2:
            continue
        order = rng.permutation(size) + start
        q[order] = np.roll(order, -1)  # order[i] -> order[i + 1]: one cycle through the block
    return q


def signs(seed: str, n: int, part: str = "eps") -> np.ndarray:
    return np.where(_rng(seed, part).random(n) < 0.5, -1.0, 1.0)


def chunk_of(n: int, largest: int = 32, fewest: int = 4) -> int:
    """The width of the column chunks a last axis of ``n`` moves in: the largest divisor of
    ``n`` up to ``largest`` that leaves at least ``fewest`` chunks (1 if none does). ONNX
    Runtime gathers contiguous chunks with one copy each, single elements one by one."""
    for b in range(min(largest, n // fewest), 1, -1):
        if n % b == 0:
            return b
    return 1


def columns(seed: str, n: int, chunk: int) -> np.ndarray:
    """The column permutation: chunks of ``chunk`` columns deranged, each kept in one piece."""
    blocks = derangement(seed, n // chunk, n // chunk)
    return (blocks[:, None] * chunk + np.arange(chunk)[None, :]).reshape(-1)


def values(spec: dict) -> np.ndarray:
    """The run-time value a secret input gets, from its spec (kept in the sealed library)."""
    seed, n, block = spec["seed"], spec["n"], spec.get("block", spec["n"])
    if spec["part"] == "rowsign":  # the sign of each row of a stored table
        dtype = ir.DataType(spec["dtype"]).numpy()
        return signs(seed, n, "rowsign").astype(dtype).reshape(n, 1)
    if spec["part"] == "insign":
        dtype = ir.DataType(spec["dtype"]).numpy()
        return signs(seed, n, "eta").astype(dtype).reshape(spec["shape"])
    chunk = spec.get("chunk")
    if chunk:
        q = columns(seed, n, chunk)
        if spec["part"] == "index":
            return np.argsort(derangement(seed, n // chunk, n // chunk)).astype(np.int64)
        inverse = np.argsort(q)
        dtype = ir.DataType(spec["dtype"]).numpy()
        return signs(seed, n)[inverse].astype(dtype).reshape(n // chunk, chunk)
    q = derangement(seed, n, block, spec.get("perm", "q"))
    inverse = np.argsort(q)
    if spec["part"] == "index":
        return inverse.astype(np.int64)
    out = signs(seed, n)[inverse].astype(ir.DataType(spec["dtype"]).numpy())
    return out.reshape(spec["shape"])


# Makes a graph input whose value the runtime supplies: (spec, dtype, rank) -> the input.
SecretInput = Callable[[dict, ir.DataType, int], ir.Value]


def _weight(node: ir.Node, index: int, smallest: int = MIN_ELEMENTS) -> np.ndarray | None:
    if len(node.inputs) <= index:
        return None
    v = node.inputs[index]
    if v is None or not is_constant(v) or len(v.uses()) != 1 or v.is_graph_output():
        return None
    t = ir.convenience.get_const_tensor(v)
    if t is None or t.dtype not in _FLOATS or t.size < smallest:
        return None
    return t.numpy()


def _bias(node: ir.Node, index: int, n: int) -> np.ndarray | None | bool:
    """The constant 1-D bias of ``n`` (None: there is none; False: one that cannot be mixed)."""
    if len(node.inputs) <= index or node.inputs[index] is None:
        return None
    b = _weight(node, index, smallest=1)
    return b if b is not None and b.shape == (n,) else False


def _set(node: ir.Node, index: int, array: np.ndarray, name: str) -> None:
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
    node.graph.register_initializer(value)
    old = node.inputs[index]
    node.replace_input_with(index, value)
    if (
        old is not None
        and old.is_initializer()
        and not old.uses()
        and not old.is_graph_input()
        and not old.is_graph_output()
    ):
        del node.graph.initializers[old.name]  # a weight no node reads any more


def _unmix(
    graph: ir.Graph, node: ir.Node, axis: int, rank: int | None, spec: dict, secret: SecretInput
) -> None:
    """After ``node``: ``y = Gather(z, idx, axis) * sgn``, its users moved to ``y``; on the last
    axis, in chunks: ``Reshape(Gather(Reshape(z, [-1, m, chunk]), idx, 1) * sgn, Shape(z))``."""
    z = node.outputs[0]
    dtype = z.dtype if z.dtype is not None else ir.DataType.FLOAT
    n = spec["n"]
    chunk = spec.get("chunk")
    shape = [n] + [1] * (rank - 2) if axis == 1 and rank is not None else [n]
    if chunk:
        shape = [n // chunk, chunk]
    idx = secret({**spec, "part": "index"}, ir.DataType.INT64, 1)
    sgn = secret({**spec, "part": "sign", "dtype": int(dtype), "shape": shape}, dtype, len(shape))
    nodes = []
    source = z
    if chunk:
        split = ir.tensor(np.array([-1, n // chunk, chunk], dtype=np.int64))
        split_shape = ir.node("Constant", [], attributes={"value": split})
        folded = ir.node("Reshape", [z, split_shape.outputs[0]])
        nodes += [split_shape, folded]
        source, axis = folded.outputs[0], 1
    gather = ir.node("Gather", [source, idx], attributes={"axis": axis})
    mul = ir.node("Mul", [gather.outputs[0], sgn])
    nodes += [gather, mul]
    y = mul.outputs[0]
    if chunk:
        original_shape = ir.node("Shape", [z])
        back = ir.node("Reshape", [mul.outputs[0], original_shape.outputs[0]])
        nodes += [original_shape, back]
        y = back.outputs[0]
    y.type, y.shape = z.type, z.shape
    was_output = z.is_graph_output()
    z.replace_all_uses_with(y, replace_graph_outputs=True)
    if was_output:
        y.name, z.name = z.name, f"{z.name}.mixed{id(z):x}"  # names.py renames every value later
    for user in nodes:  # the replacement above also moved the unmixing nodes' own input
        for i, v in enumerate(user.inputs):
            if v is y:
                user.replace_input_with(i, z)
    graph.insert_after(node, nodes)


def _flip_input(
    graph: ir.Graph, node: ir.Node, spec: dict, n: int, shape: list[int], secret: SecretInput
) -> None:
    """Before ``node``: its input 0 times ``eta`` (signs supplied at run time)."""
    x = node.inputs[0]
    dtype = x.dtype if x.dtype is not None else ir.DataType.FLOAT
    eta = secret(
        {**spec, "n": n, "part": "insign", "dtype": int(dtype), "shape": shape}, dtype, len(shape)
    )
    scale = ir.node("Mul", [x, eta])
    graph.insert_before(node, scale)
    node.replace_input_with(0, scale.outputs[0])


def _seed(rng: np.random.Generator) -> str:
    # never from the structure's seeded generator: a secret is fresh random bytes each time
    return secrets.token_hex(16)


def _conv(node, graph, rng, secret, new_name) -> bool:
    w = _weight(node, 1)
    if w is None or w.ndim < 3:
        return False
    n = w.shape[0]
    group = node.attributes.get("group")
    groups = group.value if group is not None else 1
    if groups < 1 or n % groups or n // groups < 2:
        return False  # a depthwise layer has no channels to shuffle: its weights get noise
    bias = _bias(node, 2, n)
    if bias is False:
        return False
    spec = {"seed": _seed(rng), "n": n, "block": n // groups}
    q = derangement(spec["seed"], n, spec["block"])
    eps = signs(spec["seed"], n)
    # input channels flip signs too (x * eta before the layer), so that no sum over output
    # channels alone decides the correlation: trained filters resemble each other
    per_in = w.shape[1]
    cin = per_in * groups
    eta = signs(spec["seed"], cin, "eta")
    channel = (np.arange(n)[:, None] // (n // groups)) * per_in + np.arange(per_in)[None, :]
    flips = eps[:, None] * eta[channel]
    s = w[q] * flips.reshape(flips.shape + (1,) * (w.ndim - 2))
    _set(node, 1, s.astype(w.dtype), new_name())
    _flip_input(graph, node, spec, cin, [cin] + [1] * (w.ndim - 2), secret)
    if bias is not None:
        _set(node, 2, (bias[q] * eps).astype(bias.dtype), new_name())
    _unmix(graph, node, 1, w.ndim, spec, secret)
    return True


def _matmul(node, graph, rng, secret, new_name) -> bool:
    w = _weight(node, 1)
    if w is None or w.ndim != 2:
        return False
    k, n = w.shape
    spec = {"seed": _seed(rng), "n": n, "chunk": chunk_of(n)}
    q = columns(spec["seed"], n, spec["chunk"])
    # rows flip signs too (x * eta first): columns of a trained layer resemble each other
    eta = signs(spec["seed"], k, "eta")
    _set(node, 1, (w[:, q] * signs(spec["seed"], n) * eta[:, None]).astype(w.dtype), new_name())
    _flip_input(graph, node, spec, k, [k], secret)
    _unmix(graph, node, -1, None, spec, secret)
    return True


def _gemm(node, graph, rng, secret, new_name) -> bool:
    w = _weight(node, 1)
    if w is None or w.ndim != 2:
        return False
    trans = node.attributes.get("transB")
    trans_b = bool(trans.value) if trans is not None else False
    n = w.shape[0] if trans_b else w.shape[1]
    bias = _bias(node, 2, n)
    if bias is False:
        return False
    spec = {"seed": _seed(rng), "n": n, "chunk": chunk_of(n)}
    q = columns(spec["seed"], n, spec["chunk"])
    eps = signs(spec["seed"], n)
    s = w[q] * eps[:, None] if trans_b else w[:, q] * eps
    trans = node.attributes.get("transA")
    if trans is None or not trans.value:  # A's rows are the inputs: flip them as MatMul does
        k = w.shape[1] if trans_b else w.shape[0]
        eta = signs(spec["seed"], k, "eta")
        s = s * (eta[None, :] if trans_b else eta[:, None])
        _flip_input(graph, node, spec, k, [k], secret)
    _set(node, 1, s.astype(w.dtype), new_name())
    if bias is not None:
        _set(node, 2, (bias[q] * eps).astype(bias.dtype), new_name())
    _unmix(graph, node, -1, None, spec, secret)
    return True


def _embedding(node, graph, rng, secret, new_name) -> bool:
    w = _weight(node, 0)
    axis = node.attributes.get("axis")
    if w is None or w.ndim != 2 or (axis is not None and axis.value != 0):
        return False
    rows, n = w.shape
    spec = {"seed": _seed(rng), "n": n, "chunk": chunk_of(n)}
    q = columns(spec["seed"], n, spec["chunk"])
    _set(node, 0, (w[:, q] * signs(spec["seed"], n)).astype(w.dtype), new_name())
    unsign = _rows(node, graph, spec["seed"], secret, new_name)
    _unmix(graph, unsign, -1, None, spec, secret)
    return True


def _rows(node: ir.Node, graph: ir.Graph, seed: str, secret: SecretInput, new_name) -> ir.Node:
    """An embedding table's rows deranged and sign-flipped: row ``r`` of the stored table is
    ``s[r] * W[p[r]]``; the ids go through ``p^-1`` and the looked-up rows are multiplied by
    their sign, both supplied at run time (neighbouring rows of a table, positions, resemble
    each other, and a table's columns have means that no order hides: the signs do)."""
    w = channels.const_array(node.inputs[0])
    rows = w.shape[0]
    p = derangement(seed, rows, rows, "rows")
    row_signs = signs(seed, rows, "rowsign")
    _set(node, 0, (w[p] * row_signs[:, None]).astype(w.dtype), new_name())
    ids = secret({"seed": seed, "n": rows, "perm": "rows", "part": "index"}, ir.DataType.INT64, 1)
    dtype = ir.DataType.from_numpy(w.dtype)
    row_sign = secret({"seed": seed, "n": rows, "part": "rowsign", "dtype": int(dtype)}, dtype, 2)
    remap = ir.node("Gather", [ids, node.inputs[1]], attributes={"axis": 0})
    sign = ir.node("Gather", [row_sign, remap.outputs[0]], attributes={"axis": 0})
    graph.insert_before(node, [remap, sign])
    node.replace_input_with(1, remap.outputs[0])
    z = node.outputs[0]
    unsign = ir.node("Mul", [z, sign.outputs[0]])
    unsigned = unsign.outputs[0]
    unsigned.type, unsigned.shape = z.type, z.shape
    was_output = z.is_graph_output()
    z.replace_all_uses_with(unsigned, replace_graph_outputs=True)
    if was_output:
        unsigned.name, z.name = z.name, f"{z.name}.mixed{id(z):x}"
    unsign.replace_input_with(0, z)
    graph.insert_after(node, unsign)
    return unsign


MIXERS = {"Conv": _conv, "MatMul": _matmul, "Gemm": _gemm, "Gather": _embedding}


def _restore(graph: ir.Graph, bound: channels.Boundary, seed: str, n: int, secret) -> None:
    """``y = Gather(z, q^-1, axis)`` for the boundary's users (and the graph's outputs)."""
    z = bound.value
    idx = secret({"seed": seed, "n": n, "part": "index"}, ir.DataType.INT64, 1)
    axis = bound.axis if z.shape is None else len(z.shape) + bound.axis
    gather = ir.node("Gather", [z, idx], attributes={"axis": axis})
    y = gather.outputs[0]
    y.type, y.shape = z.type, z.shape
    graph.insert_after(z.producer(), gather)
    for user in bound.users:
        for i, v in enumerate(user.inputs):
            if v is z:
                user.replace_input_with(i, y)
    if bound.output:
        name = z.name
        z.name = f"{name}.mixed{id(z):x}"  # names.py renames every value later
        y.name = name
        for i, out in enumerate(graph.outputs):
            if out is z:
                graph.outputs[i] = y


def _taken(array: np.ndarray, how: list[tuple[int, int]], orders: dict) -> np.ndarray:
    for axis, group in how:
        array = np.take(array, orders[group], axis=axis)
    return np.ascontiguousarray(array)


def _choose(
    sizes: dict[int, int],
    tensors: list[tuple[np.ndarray, list]],
    originals: list[np.ndarray],
    rng: np.random.Generator,
) -> dict[int, str]:
    """A seed per group: of ``CANDIDATES`` fresh ones (more, up to the second number, until one
    scores under ``TARGET_Z``), the one whose order leaves the group's
    weights least correlated with the originals (the largest z-score of |Pearson r| over every
    axis order of the weight itself and, up to ``CROSS_ELEMENTS``, of every original constant of
    its size; the other groups' orders as chosen so far). Any derangement keeps a weight at the
    chance level on average; trained weights have structure (filters alike, the same outlier
    channels in every LayerNorm of a transformer, which an order may happen to line up), and
    this keeps the worst case away from the threshold the recovery checks apply."""
    seeds: dict[int, list[str]] = {g: [_seed(rng)] for g in sizes}
    chosen = {g: 0 for g in sizes}
    by_size: dict[int, list[np.ndarray]] = {}
    for a in originals:
        if SCORED_ELEMENTS[0] <= a.size <= CROSS_ELEMENTS and a.dtype.kind == "f":
            by_size.setdefault(a.size, []).extend(views(a))
    cross = {n: standardized(rows) for n, rows in by_size.items()}
    # a permutation changes neither mean nor norm: the standardized weight, permuted, is the
    # permuted weight standardized
    candidates = [
        (a, how)
        for a, how in tensors
        if SCORED_ELEMENTS[0] <= a.size <= SCORED_ELEMENTS[1] and a.dtype.kind == "f"
    ]

    def scored(a: np.ndarray, how: list) -> tuple[np.ndarray, np.ndarray, list]:
        # float64 rows of every view: made for one group at a time (memory: issue 27)
        rows = cross[a.size] if a.size in cross else standardized(views(a))
        return rows, standardized([a])[0].reshape(a.shape), how

    def order(g: int, k: int) -> np.ndarray:
        return derangement(seeds[g][k], sizes[g], sizes[g])

    for g in sorted(sizes, key=sizes.get, reverse=True):
        mine = [scored(a, how) for a, how in candidates if any(group == g for _, group in how)]
        if len(mine) == 0:
            continue
        worst: list[float] = []
        while len(worst) < CANDIDATES[1] and (len(worst) < CANDIDATES[0] or min(worst) > TARGET_Z):
            k = len(worst)
            if k == len(seeds[g]):
                seeds[g].append(_seed(rng))
            orders = {
                h: order(h, k if h == g else chosen[h]) for _, h in sum((t[2] for t in mine), [])
            }
            z = max(
                float(np.abs(v @ _taken(a, how, orders).reshape(-1)).max()) * np.sqrt(a.size)
                for v, a, how in mine
            )
            worst.append(z)
        chosen[g] = int(np.argmin(worst))
    return {g: seeds[g][k] for g, k in chosen.items()}


def mix(
    graph: ir.Graph, *, rng: np.random.Generator, secret: SecretInput, new_name: Callable[[], str]
) -> int:
    """Mix every layer of ``graph`` that the rule covers (in place); returns how many layers'
    weights changed."""
    plan = channels.plan(graph)
    takes: dict[tuple[ir.Node, int], set[tuple[int, int]]] = {}
    for e in plan.edits:
        takes.setdefault((e.node, e.index), set()).add((e.axis, e.group))
    arrays = {key: channels.const_array(key[0].inputs[key[1]]) for key in takes}
    originals = [
        v.const_value.numpy()
        for v in graph.initializers.values()
        if v.const_value is not None and v.const_value.size <= CROSS_ELEMENTS
    ]
    chosen = [(arrays[k], sorted(how)) for k, how in takes.items()]
    seeds = _choose(plan.sizes, chosen, originals, rng)
    orders = {g: derangement(seeds[g], n, n) for g, n in plan.sizes.items()}
    for (node, index), how in takes.items():
        _set(node, index, _taken(arrays[node, index], sorted(how), orders), new_name())
    for bound in plan.boundaries:
        _restore(graph, bound, seeds[bound.group], plan.sizes[bound.group], secret)
    changed = {node for node, _ in takes}
    for g, producers in plan.producers.items():
        for node in producers:
            table = channels.const_array(node.inputs[0]) if node.op_type == "Gather" else None
            if table is not None and table.size >= MIN_ELEMENTS:
                _rows(node, graph, seeds[g], secret, new_name)
    done = len(changed)
    for node in list(graph):
        rule = MIXERS.get(node.op_type)
        if (
            node not in changed
            and rule is not None
            and node.domain in ("", "ai.onnx")
            and rule(node, graph, rng, secret, new_name)
        ):
            done += 1
    return done
