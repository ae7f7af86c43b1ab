"""The protection, measured: what the obfuscated file shows, compared with the original model.

Each number is computed from what the obfuscated file holds alone (plus the original, to
compare), with no knowledge of how the obfuscation was done: its bytes, or the model that is
written (then the bytes searched are its payload stream, ``payload.model_stream``, read piece by
piece, so the file is never held whole in memory):

- ``anonymous_share``: of the compute nodes (every node but Constant), the share whose op type
  belongs to no standard domain (so no runtime or reader knows what it computes);
- ``op_histogram_distance``: the total-variation distance between the original's and the file's
  op-type histograms, *after matching the file's types to the original's in the way that makes
  them closest* (sorting both by count is that matching). So it credits a reader who guesses each
  anonymous type from how often it occurs; 0 means the counts alone give the architecture away;
- ``nodes``/``edges`` against the original's (every graph, subgraphs included; an edge is a
  node input that is set);
- ``max_weight_correlation``: the largest |Pearson correlation| between any numeric tensor stored
  in the file and any original weight with the same number of elements (``weight_pairs`` says how
  many pairs that was; pairs where either side is constant have no correlation and are skipped);
- ``names_found``: original names (of at least ``MIN_NAME_CHARS`` characters; shorter strings
  turn up in any few megabytes of random bytes) found anywhere in the file's bytes. Names that
  are part of the interface the file keeps on purpose (input and output names unless renamed,
  their dimensions' names always) cannot be told apart there and are counted apart
  (``names_in_interface``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.ir import from_bytes
from modelpress.protect import payload
from modelpress.protect.correlation import max_correlation
from modelpress.protect.names import all_names
from modelpress.protect.weights import constant_tensors

STANDARD_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training")
MIN_NAME_CHARS = 5
MIN_WEIGHT_ELEMENTS = 16


def is_standard(domain: str) -> bool:
    return domain in STANDARD_DOMAINS or domain.startswith("com.microsoft")


@dataclass
class ProtectionMetrics:
    compute_nodes: int
    anonymous_nodes: int
    anonymous_share: float
    visible_op_types: list[str]
    op_histogram_distance: float
    original_nodes: int
    nodes: int
    node_change: float
    original_edges: int
    edges: int
    edge_change: float
    weight_pairs: int
    max_weight_correlation: float
    names_checked: int
    names_too_short: int
    names_in_interface: int
    names_found: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _nodes(model: ir.Model) -> list[ir.Node]:
    return [n for g in model.graphs() for n in g]


def _compute(nodes: list[ir.Node]) -> list[ir.Node]:
    return [n for n in nodes if not (n.op_type == "Constant" and is_standard(n.domain))]


def _edges(nodes: list[ir.Node]) -> int:
    return sum(1 for n in nodes for v in n.inputs if v is not None)


def histogram_distance(a: Counter, b: Counter) -> float:
    """TV distance of two op-type histograms under the best matching of types (label-free)."""
    pa = sorted((c / max(sum(a.values()), 1) for c in a.values()), reverse=True)
    pb = sorted((c / max(sum(b.values()), 1) for c in b.values()), reverse=True)
    n = max(len(pa), len(pb))
    pa += [0.0] * (n - len(pa))
    pb += [0.0] * (n - len(pb))
    return 0.5 * float(sum(abs(x - y) for x, y in zip(pa, pb)))


def names_in(data: bytes, names: list[str]) -> list[str]:
    """The ``names`` that occur anywhere in ``data``.

    An ASCII name of ``MIN_NAME_CHARS`` or more can only start where that many printable bytes
    follow; the four-byte heads found at such places are collected (a small set, since most of
    a protected file is noise) and only a name whose head is among them is searched for."""
    ascii_names = [n for n in names if n.isascii() and n.isprintable() and len(n) >= MIN_NAME_CHARS]
    searched = set(ascii_names)
    found = [n for n in names if n not in searched and n.encode() in data]
    arr = np.frombuffer(data, dtype=np.uint8)
    if len(arr) < MIN_NAME_CHARS or not ascii_names:
        return found
    printable = (arr >= 0x20) & (arr <= 0x7E)
    starts = printable[: len(arr) - MIN_NAME_CHARS + 1].copy()
    for k in range(1, MIN_NAME_CHARS):
        starts &= printable[k : len(arr) - MIN_NAME_CHARS + 1 + k]
    at = np.flatnonzero(starts)
    heads = arr[at].astype(np.uint32) << 24 | arr[at + 1].astype(np.uint32) << 16
    heads |= arr[at + 2].astype(np.uint32) << 8 | arr[at + 3].astype(np.uint32)
    heads.sort()
    wanted = np.array([int.from_bytes(n.encode()[:4], "big") for n in ascii_names], dtype=np.uint32)
    where = np.minimum(np.searchsorted(heads, wanted), max(len(heads) - 1, 0))
    hits = heads[where] == wanted if len(heads) else np.zeros(len(wanted), dtype=bool)
    found += [n for n, hit in zip(ascii_names, hits) if hit and n.encode() in data]
    return found


_SEARCH_PIECE = 8 << 20  # names_in's working set is a few times the bytes it is given


def names_in_pieces(pieces: Iterable[bytes | memoryview], names: list[str]) -> list[str]:
    """``names_in`` over the concatenation of ``pieces``, never held whole: each piece is searched
    together with the end of the one before (a name's length less one byte), so a name across a
    boundary is found too. The order is ``names``'s."""
    longest = max((len(n.encode()) for n in names), default=0)
    found: set[str] = set()
    tail = b""
    for piece in pieces:
        view = memoryview(piece).cast("B")
        for start in range(0, len(view), _SEARCH_PIECE):
            data = tail + bytes(view[start : start + _SEARCH_PIECE])
            found.update(names_in(data, [n for n in names if n not in found]))
            tail = data[-(longest - 1) :] if longest > 1 else b""
    return [n for n in names if n in found]


def measure(
    original: ir.Model, obfuscated: ir.Model | bytes, *, interface_kept: bool = True
) -> ProtectionMetrics:
    """The metrics of the obfuscated model ``obfuscated`` (the model that is written, or the
    file's bytes) against ``original``."""
    if isinstance(obfuscated, ir.Model):
        model = obfuscated
        pieces: Iterable = payload.model_stream(model)[1]
    else:
        model = from_bytes(obfuscated, source="obfuscated model")
        pieces = [obfuscated]
    nodes = _nodes(model)
    compute = _compute(nodes)
    anonymous = [n for n in compute if not is_standard(n.domain)]
    orig_nodes = _nodes(original)
    orig_compute = _compute(orig_nodes)
    hist_o = Counter((n.domain, n.op_type) for n in orig_compute)
    hist_f = Counter((n.domain, n.op_type) for n in compute)
    corr, pairs = max_correlation(
        constant_tensors(model, kinds="fiub", min_size=MIN_WEIGHT_ELEMENTS),
        constant_tensors(original, kinds="fiub", min_size=MIN_WEIGHT_ELEMENTS),
    )
    names = all_names(original)
    # The interface stays in the file on purpose: its dimension names always, its value names
    # unless renamed. A name found only as part of one of those strings cannot be told apart.
    interface = [
        str(d)
        for v in (*original.graph.inputs, *original.graph.outputs)
        for d in (v.shape or ())
        if not isinstance(d, int)
    ]
    if interface_kept:
        interface += [v.name for v in (*original.graph.inputs, *original.graph.outputs) if v.name]
    in_interface = {n for n in names if any(n in s for s in interface)}
    names -= in_interface
    checked = sorted(n for n in names if len(n.encode()) >= MIN_NAME_CHARS)
    found = names_in_pieces(pieces, checked)
    return ProtectionMetrics(
        compute_nodes=len(compute),
        anonymous_nodes=len(anonymous),
        anonymous_share=len(anonymous) / max(len(compute), 1),
        visible_op_types=sorted({n.op_type for n in compute if is_standard(n.domain)}),
        op_histogram_distance=histogram_distance(hist_o, hist_f),
        original_nodes=len(orig_compute),
        nodes=len(compute),
        node_change=(len(compute) - len(orig_compute)) / max(len(orig_compute), 1),
        original_edges=_edges(orig_nodes),
        edges=_edges(nodes),
        edge_change=(_edges(nodes) - _edges(orig_nodes)) / max(_edges(orig_nodes), 1),
        weight_pairs=pairs,
        max_weight_correlation=corr,
        names_checked=len(checked),
        names_too_short=len(names) - len(checked),
        names_in_interface=len(in_interface),
        names_found=found,
    )
