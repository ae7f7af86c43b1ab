"""What a batch run writes: one JSON line per item (``.jsonl``) or the outputs' arrays (``.npz``).

Results go to the journal batch by batch (``encode_*``) and become the output file only when
every item is there (``finalize``): lines in the items' order, arrays concatenated in it. A line is
``{"id": ..., <answer>}`` where the answer is the model's post-processing (``{"classes": [...]}``)
or, without one, each output's values; an item that could not be read is ``{"id": ...,
"error": "..."}``.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

from modelpress.errors import InputError, OptionError
from modelpress.ir.files import atomic, write_npz
from modelpress.runtime.batch.journal import Journal

FORMATS = (".jsonl", ".npz")


def output_format(path: str | os.PathLike) -> str:
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise OptionError(
            f"-o {path}: write predictions to a .jsonl file (or an .npz for .npz data)"
        )
    return suffix[1:]


def json_line(item_id: str, answer: dict) -> bytes:
    return (
        json.dumps({"id": item_id, **answer}, ensure_ascii=False, allow_nan=True) + "\n"
    ).encode()


def answers(processing, outputs: dict[str, np.ndarray]) -> list[dict]:
    """One answer per row: the declared post-processing, or every output's row as a list."""
    if processing is not None:
        return processing.postprocess(outputs)
    n = next(iter(outputs.values())).shape[0]
    return [{k: v[i].tolist() for k, v in outputs.items()} for i in range(n)]


def npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def finalize(journal: Journal, path: str | os.PathLike, fmt: str, total: int) -> int:
    """Write the output from ``journal`` (atomically) and return the number of items in it."""
    records = list(journal)
    done = sorted(i for r in records for i in r.items)
    if done != list(range(total)):
        missing = sorted(set(range(total)) - set(done))
        raise InputError(
            f"{journal.path}: {len(missing)} item(s) missing at the end of the run (first: {missing[:3]})"
        )
    if fmt == "jsonl":
        lines: list[bytes | None] = [None] * total
        for r in records:
            for i, line in zip(r.items, r.data.splitlines(keepends=True), strict=True):
                lines[i] = line
        with atomic(path) as f:
            f.writelines(lines)
        return total
    parts: dict[str, list[np.ndarray]] = {}
    order: list[int] = []
    for r in records:
        with np.load(io.BytesIO(r.data), allow_pickle=False) as data:
            for k in data.files:
                parts.setdefault(k, []).append(data[k])
        order.extend(r.items)
    rank = np.argsort(np.asarray(order), kind="stable")
    write_npz(path, {k: np.concatenate(v)[rank] if len(v) > 1 else v[0] for k, v in parts.items()})
    return total
