"""Whether this CPU's int4 kernel computes a row the same way alone and in a batch.

ONNX Runtime's ``MatMulNBits`` (MLAS) picks its kernel by the CPU and by the number of rows: on
some x86 builds (AVX2, AVX2-VNNI) a single row takes a kernel of its own that applies the zero
points inside the dot products, while two rows or more take a GEMM that adds them afterwards
from block sums. The two round differently, and activations quantized per block turn such a
last-bit difference into another code, so a greedy answer decoded alone could differ from the
same request decoded beside others. On the AVX-512 machines this project was measured on, one
kernel serves every row count and the bits agree.

``int4_rows_agree`` asks the running CPU: a small ``MatMulNBits`` with the folder's block size
and zero points, rows run alone and four together, compared bit for bit (a few milliseconds,
once per setting). ``LLM.batch_invariant`` uses it, and ``serve`` says when it does not hold.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx_ir as ir

from modelpress.ir import nbits
from modelpress.runtime.ort import session, session_options

K, N, ROWS = 256, 96, 4  # several blocks along K and several column tiles along N


def blocks(block_size: int, symmetric: bool) -> nbits.Blocks:
    """The probe's weights: random 4-bit codes, scales and (asymmetric) zero points."""
    rng = np.random.default_rng(0)
    count = K // block_size
    return nbits.Blocks(
        codes=rng.integers(0, 16, (N, K), dtype=np.uint8),
        scales=rng.uniform(0.01, 0.05, (N, count)).astype(np.float32),
        zero_points=None if symmetric else rng.integers(0, 16, (N, count), dtype=np.uint8),
        bits=4,
        block_size=block_size,
    )


def model(block_size: int, symmetric: bool, accuracy_level: int) -> ir.Model:
    """``y = MatMulNBits(a, blocks(...))`` with ``a`` of any number of rows."""
    a = ir.Value(name="a", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["m", K]))
    graph = ir.Graph(inputs=[a], outputs=[], nodes=[], opset_imports={"": 21, nbits.MS_DOMAIN: 1})
    nodes, y = nbits.matmul_nbits(
        graph, a, blocks(block_size, symmetric), name="probe", accuracy_level=accuracy_level
    )
    graph.extend(nodes)
    y.shape = ir.Shape(["m", N])
    graph.outputs.append(y)
    return ir.Model(graph, ir_version=10)


@functools.cache
def int4_rows_agree(
    block_size: int = 32, symmetric: bool = False, accuracy_level: int = 4, threads: int = 1
) -> bool:
    """Whether ``MatMulNBits`` (4 bits, this block size and zero points) gives each row the same
    bits alone as among ``ROWS`` rows, on this CPU and with ``threads`` intra-op threads."""
    sess = session(
        model(block_size, symmetric, accuracy_level),
        options=session_options(intra_op_threads=max(1, int(threads))),
    )
    a = np.random.default_rng(1).standard_normal((ROWS, K)).astype(np.float32)
    a[:, ::7] *= 20.0  # a few large channels, as decoders' activations have
    together = sess.run(None, {"a": a})[0]
    alone = np.concatenate([sess.run(None, {"a": a[i : i + 1]})[0] for i in range(ROWS)])
    return bool(np.array_equal(together.view(np.uint32), alone.view(np.uint32)))
