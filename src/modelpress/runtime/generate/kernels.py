"""Whether this CPU's kernels compute a row the same way alone and in a batch.

ONNX Runtime's int4 ``MatMulNBits`` (MLAS) picks its kernel by the CPU, the block size and the
number of rows: AVX2 and AVX2-VNNI builds give a single row a kernel of their own, which applies
the zero points inside the dot products where the batched GEMM adds them afterwards from block
sums; on the AVX-512 machines this project was measured on, blocks of 64 and 128 run rows in
pairs otherwise than a lone row, and block 32 computes every row alike. Such a difference is in
the last bits, but activations quantized per block turn it into another code, so a greedy answer
decoded alone could differ from the same request decoded beside others.

``rows_agree`` asks the folder's own model on the running CPU: one-token decode steps from empty
caches, each of 8 rows alone and the first 2, 3, 4, 5 and 8 together (every ``MatMulNBits`` of
the model at those row counts, with its real shapes and threads), each row's logits compared bit
for bit. Thirteen one-token steps; it loads nothing (the server keeps graph tools out of its
memory).
"""

from __future__ import annotations

import numpy as np

from modelpress.ir.llm import DecoderConfig
from modelpress.runtime.generate.cache import KVCache

BATCHES = (2, 3, 4, 5, 8)  # row counts a kernel may tile differently (pairs, fours, a remainder)


def rows_agree(decoder, config: DecoderConfig) -> bool:
    """Whether ``decoder`` gives each row the same logits, bit for bit, alone as in batches of
    ``BATCHES`` rows (a one-token step from empty caches, rows of different tokens)."""
    tokens = (np.arange(max(BATCHES), dtype=np.int64)[:, None] + 1) % config.vocab_size

    def step(ids: np.ndarray) -> np.ndarray:
        cache = KVCache.empty(config, rows=len(ids))
        mask, positions = cache.step_inputs(new=1)
        out, _, _ = decoder(ids, mask, positions, cache.keys, cache.values)
        return np.array(out, dtype=np.float32).reshape(len(ids), -1)  # a copy: buffers are reused

    alone = np.concatenate([step(tokens[i : i + 1]) for i in range(len(tokens))])
    return all(
        np.array_equal(step(tokens[:n]).view(np.uint32), alone[:n].view(np.uint32)) for n in BATCHES
    )
