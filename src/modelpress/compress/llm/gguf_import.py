"""Import a GGUF's own quantized blocks into the LLM folder converted from it: no re-quantization.

``modelpress convert model.gguf`` dequantizes the GGUF to float; ``import_gguf_blocks`` then puts
the file's Q4_0, Q4_1 and Q8_0 blocks back, unchanged, into the decoder's MatMuls (as
``MatMulNBits``, or ``DequantizeLinear`` + ``MatMul`` at the standard level) and its embedding
(``GatherBlockQuantized``), so the folder computes what llama.cpp computes from the same file.

Block formats (llama.cpp's ``ggml-common.h``; 32 elements a block along a row, one row per
output feature ``n``, the row running along ``K``):

- ``Q4_0``: ``d`` (f16), 16 bytes; element ``j < 16`` is the low nibble of byte ``j``, element
  ``j + 16`` its high nibble; ``w = d * (q - 8)``: scale ``d``, the implicit zero point 8.
- ``Q4_1``: ``d``, ``m`` (f16), 16 bytes as above; ``w = d * q + m``: scale ``d``, float zero
  point ``-m / d``. A block with ``d = 0`` holds ``m`` everywhere: its codes become 1 with zero
  point 0 and scale ``m``.
- ``Q8_0``: ``d`` (f16), 32 int8; ``w = d * q``: codes ``q + 128``, implicit zero point 128.

Any other type (F32, F16, K-quants) leaves that weight as the folder has it, said in the notes.

Matching a folder weight to its GGUF tensors: by name (``blk.{i}.attn_q`` + ``attn_k`` +
``attn_v`` → the fused ``qkv_proj``; ``ffn_gate`` + ``ffn_up`` → ``gate_up_proj``;
``attn_output``, ``ffn_down``; ``output`` or, tied, ``token_embd`` → ``lm_head``). llama.cpp
stores a Llama's Q and K rows permuted for its rope; the permutation moves whole rows, so it is
undone on the rows of codes, scales and zero points. The exporter may also have scaled rows
(the attention scale folded into Q): each row's factor is measured against the folder's float
weight and multiplied into that row's scales, and every imported weight must then equal the
folder's float weight (relative error ``MATCH_RTOL`` of its largest element) or the import stops
with an error naming the tensor: the folder was not converted from this file.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from modelpress.compress.llm.output import write_folder
from modelpress.compress.llm.quantize import _embedding_tables
from modelpress.errors import ConversionError, InputError, require
from modelpress.ir import llm, load, nbits
from modelpress.ir.graph import remove_unused_initializers, swap_node
from modelpress.ir.match import const_array
from modelpress.ir.opset import at_opset

QK = 32  # elements per block in Q4_0, Q4_1 and Q8_0
MATCH_RTOL = 1e-3
LAYER_SOURCES = {
    "self_attn.qkv_proj": ("attn_q", "attn_k", "attn_v"),
    "self_attn.o_proj": ("attn_output",),
    "mlp.gate_up_proj": ("ffn_gate", "ffn_up"),
    "mlp.up_proj": ("ffn_up",),
    "mlp.down_proj": ("ffn_down",),
}


def _f16(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """``[..., 16]`` bytes → ``[..., 32]`` codes in llama.cpp's order (low nibbles first)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def gguf_blocks(data: np.ndarray, type_name: str, k: int) -> nbits.Blocks | None:
    """``Blocks`` of a GGUF tensor's raw rows (``[N, bytes]``), or ``None`` for other types."""
    n = data.shape[0]
    nb = k // QK
    if type_name == "Q4_0":
        b = data.reshape(n, nb, 18)
        d = _f16(b[..., 0:2])
        codes = _nibbles(b[..., 2:]).reshape(n, k)
        return nbits.Blocks(codes, d, None, 4, QK)
    if type_name == "Q4_1":
        b = data.reshape(n, nb, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        codes = _nibbles(b[..., 4:]).reshape(n, nb, QK)
        flat = d == 0
        safe = np.where(flat, 1.0, d)
        zp = np.where(flat, 0.0, -m / safe).astype(np.float32)
        scale = np.where(flat, m, d).astype(np.float32)
        codes[flat] = 1
        return nbits.Blocks(codes.reshape(n, k), scale, zp, 4, QK)
    if type_name == "Q8_0":
        b = data.reshape(n, nb, 34)
        d = _f16(b[..., 0:2])
        q = b[..., 2:].copy().view(np.int8).astype(np.int16) + 128
        return nbits.Blocks(q.astype(np.uint8).reshape(n, k), d, None, 8, QK)
    return None


def _rows(blocks: nbits.Blocks, order: np.ndarray) -> nbits.Blocks:
    zp = None if blocks.zero_points is None else blocks.zero_points[order]
    return nbits.Blocks(
        blocks.codes[order], blocks.scales[order], zp, blocks.bits, blocks.block_size
    )


def _concat(parts: list[nbits.Blocks]) -> nbits.Blocks | None:
    """Blocks stacked along ``N`` (the fused projections); ``None`` unless all share one form."""
    first = parts[0]
    if any(
        p.bits != first.bits
        or (p.zero_points is None) != (first.zero_points is None)
        or p.float_zero_points != first.float_zero_points
        for p in parts
    ):
        return None
    zp = None if first.zero_points is None else np.concatenate([p.zero_points for p in parts])
    return nbits.Blocks(
        np.concatenate([p.codes for p in parts]),
        np.concatenate([p.scales for p in parts]),
        zp,
        first.bits,
        QK,
    )


def _unpermute_order(n: int, heads: int) -> np.ndarray:
    """Row order that undoes llama.cpp's rope permutation (``reshape(heads, 2, n/heads/2)``
    ``.swapaxes(1, 2)`` of the Hugging Face rows)."""
    idx = np.arange(n)
    return idx.reshape(heads, n // heads // 2, 2).swapaxes(1, 2).reshape(n)


def _fit_rows(blocks: nbits.Blocks, target: np.ndarray, where: str) -> nbits.Blocks:
    """``blocks`` with each row's scales times the factor that maps it onto ``target`` ``[K, N]``
    (the exporter's row scaling); ``ConversionError`` when the rows do not match."""
    w = blocks.dequantize().astype(np.float64)
    t = target.astype(np.float64)
    den = np.sum(w * w, axis=0)
    c = np.where(den > 0, np.sum(w * t, axis=0) / np.where(den > 0, den, 1), 1.0)
    c = np.where(np.abs(c - 1) < 1e-6, 1.0, c)
    err = np.abs(w * c - t).max()
    if err > MATCH_RTOL * max(np.abs(t).max(), 1e-12):
        raise ConversionError(
            f"{where}: the GGUF's blocks do not match the folder's weight (max error {err:.3g}): "
            "was the folder converted from this GGUF?"
        )
    scales = (blocks.scales * c[:, None]).astype(np.float32)
    return nbits.Blocks(blocks.codes, scales, blocks.zero_points, blocks.bits, QK)


@dataclass
class GGUFImportResult:
    output: str
    imported: dict  # folder weight → GGUF type(s)
    kept_float: list[str]
    notes: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


def _metadata(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def import_gguf_blocks(
    folder: str | os.PathLike,
    gguf_file: str | os.PathLike,
    output: str | os.PathLike,
    *,
    level: str = "ort",
    embeddings: bool = True,
    accuracy_level: int = 4,
) -> GGUFImportResult:
    """``output``: ``folder`` with its MatMul weights (and its embedding, ``embeddings``) replaced
    by the GGUF's own blocks (module docstring). ``accuracy_level``: MatMulNBits' attribute
    (4: activations quantized to int8 per block, ONNX Runtime's fast CPU path, as
    ``quantize_llm``; 0: float arithmetic on the dequantized weights)."""
    gguf = require("gguf", extra="llm", purpose="reading a GGUF file")
    src, gpath = Path(folder), Path(gguf_file)
    config = llm.read_config(src)
    if not gpath.is_file():
        raise InputError(f"{gpath}: no such file")
    try:
        reader = gguf.GGUFReader(str(gpath))
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise InputError(f"{gpath}: not a readable GGUF file ({str(exc)[:120]})") from None
    tensors = {t.name: t for t in reader.tensors}
    arch_name = str(_metadata(reader, "general.architecture") or "")
    heads = _metadata(reader, f"{arch_name}.attention.head_count")
    kv_heads = _metadata(reader, f"{arch_name}.attention.head_count_kv") or heads
    permuted = arch_name == "llama"
    model = load(src / llm.MODEL_FILE)
    graph = model.graph
    imported, kept, notes = {}, [], []

    def source(name: str, rows: int) -> tuple[nbits.Blocks | None, str]:
        t = tensors.get(name)
        if t is None:
            return None, "missing"
        k = int(t.shape[0])
        blocks = gguf_blocks(np.asarray(t.data).reshape(rows, -1), t.tensor_type.name, k)
        if blocks is not None and permuted and name.endswith(("attn_q.weight", "attn_k.weight")):
            h = heads if "attn_q" in name else kv_heads
            blocks = _rows(blocks, _unpermute_order(rows, h))
        return blocks, t.tensor_type.name

    for node in list(graph):
        if node.op_type != "MatMul" or const_array(node.inputs[1]) is None:
            continue
        w_name = node.inputs[1].name
        target = const_array(node.inputs[1])
        k, n = target.shape
        names = _gguf_names(w_name, tensors)
        if names is None:
            continue
        parts, types = [], []
        for name in names:
            rows = tensors[name].shape[1] if name in tensors else 0
            b, kind = source(name, int(rows))
            parts.append(b)
            types.append(kind)
        blocks = None if any(p is None for p in parts) else _concat(parts)
        if blocks is None or blocks.k != k or blocks.n != n:
            kept.append(w_name)
            notes.append(f"{w_name}: GGUF type(s) {', '.join(types)} kept as the folder's float")
            continue
        blocks = _fit_rows(blocks, target, f"{gpath.name}: {', '.join(names)}")
        if level == "standard":
            new_nodes, y = nbits.dq_matmul(graph, node.inputs[0], blocks, name=node.name)
        else:
            new_nodes, y = nbits.matmul_nbits(
                graph, node.inputs[0], blocks, name=node.name, accuracy_level=accuracy_level
            )
        swap_node(graph, node, new_nodes, y)
        imported[w_name] = "+".join(sorted(set(types)))
    if embeddings:
        for node in _embedding_tables(model, config.vocab_size):
            t = tensors.get("token_embd.weight")
            table = const_array(node.inputs[0])
            b = None
            if t is not None:
                b = gguf_blocks(
                    np.asarray(t.data).reshape(table.shape[0], -1),
                    t.tensor_type.name,
                    table.shape[1],
                )
            if b is None or b.float_zero_points:
                kept.append(node.inputs[0].name)
                notes.append(
                    f"{node.inputs[0].name}: GGUF type {t.tensor_type.name if t else 'missing'} "
                    "has no GatherBlockQuantized form: kept float"
                )
                continue
            b = _fit_rows(b, table.T, f"{gpath.name}: token_embd.weight")
            table_name = node.inputs[0].name
            new_nodes, y = nbits.gather_block_quantized(
                graph, node.inputs[1], b, name=node.name or "embed", standard=level == "standard"
            )
            swap_node(graph, node, new_nodes, y)
            imported[table_name] = t.tensor_type.name
    if not imported:
        raise ConversionError(f"{gpath}: no Q4_0, Q4_1 or Q8_0 tensor matches a weight of {src}")
    remove_unused_initializers(graph)
    if level == "standard":
        model, upgraded = at_opset(model, nbits.STANDARD_OPSET, "DequantizeLinear with blocks")
        notes += upgraded
    else:
        model.opset_imports.setdefault(nbits.MS_DOMAIN, 1)
    types = sorted(set(imported.values()))
    new_config = replace(
        config,
        level="standard" if level == "standard" and config.level == "standard" else "ort",
        quantization={
            "mode": "gguf",
            "method": "imported",
            "source": gpath.name,
            "types": types,
            "block_size": QK,
            "imported": len(imported),
            "kept_float": kept,
            "format": "DequantizeLinear+MatMul" if level == "standard" else "MatMulNBits",
        },
    )
    write_folder(src, Path(output), model, new_config)
    return GGUFImportResult(str(output), imported, kept, notes)


def _gguf_names(weight: str, tensors: dict) -> list[str] | None:
    """The GGUF tensors that make up the folder weight ``weight`` (module docstring)."""
    if weight == "lm_head.MatMul.weight":
        return ["output.weight" if "output.weight" in tensors else "token_embd.weight"]
    parts = weight.split(".")
    if len(parts) < 5 or parts[0] != "model" or parts[1] != "layers":
        return None
    prefix = ".".join(parts[3:5])
    sources = LAYER_SOURCES.get(prefix)
    if sources is None:
        return None
    return [f"blk.{parts[2]}.{s}.weight" for s in sources]
