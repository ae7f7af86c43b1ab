"""Generated inputs that the original model can actually run on.

Many real models cannot run at the smallest sizes: a reflection ``Pad`` longer than its input, a
detector whose feature maps of a 2x2 image no longer line up, a reshape that needs a multiple of
32. So the sizes of the *free* dynamic dimensions (those the caller did not size by name or by
shape) are searched: the usual small size first, then larger ones, with a batch of one, until the
original model runs on every generated set. The sizes that failed, and why, are kept for the
caller to report. When no size works, the error says that the *original* model cannot run on
generated inputs, so that nobody blames the transformation being checked.

Rule, for every candidate: a free dimension that leads a rank >= 2 input (a batch) stays small,
every other free dimension takes the candidate size; a named dimension has one size everywhere.
A candidate whose inputs pass ``MAX_INPUT_BYTES`` ends the search.

Anonymous dimensions (``?``) carry no name that says two of them are one, yet graphs tie them: a
recurrent state ``[2, ?, 128]`` holds the batch of the signal ``[?, ?]`` in its second axis (as
silero-vad does). So when a candidate fails, each other free dimension in turn is tied to the
batch (given the batch's size) before the next candidate is tried; the ties that made the model
run are kept for the caller to report.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import InputError, renamed
from modelpress.ir.shapes import static_dim
from modelpress.verify.inputs import MAX_INPUT_BYTES, dim_name, generate_inputs, planned_shapes

# (batch, other free dimensions): the historical default first, then growing sizes.
CANDIDATES: tuple[tuple[int, int], ...] = ((2, 2), (1, 8), (1, 32), (1, 128), (1, 512))

Runner = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]


@dataclass
class FittedInputs:
    """Input sets the original model runs on, and its outputs on each."""

    feeds: list[dict[str, np.ndarray]]
    outputs: list[dict[str, np.ndarray]]
    size: tuple[int, int] | None = None  # (batch, other) used for free dimensions; None: none free
    failed: list[tuple[tuple[int, int], str]] = field(default_factory=list)  # sizes refused, why
    tied: list[str] = field(default_factory=list)  # free dimensions given the batch's size

    @property
    def note(self) -> str | None:
        """One line for the user when the first sizes did not fit, else None."""
        if not self.failed or self.size is None:
            return None
        tried = " and ".join(str(other) for (_, other), _ in self.failed)
        ties = f", tied to it: {', '.join(self.tied)}" if self.tied else ""
        return (
            f"generated inputs give size {self.size[1]} to the dynamic dimensions not sized by the "
            f"caller (a leading batch: {self.size[0]}{ties}): the original model fails at {tried} "
            f"({self.failed[-1][1]})"
        )

    def to_dict(self) -> dict:
        return {
            "size": None if self.size is None else {"batch": self.size[0], "other": self.size[1]},
            "failed": [{"batch": b, "other": o, "error": why} for (b, o), why in self.failed],
            "tied_to_batch": list(self.tied),
            "shapes": {k: list(v.shape) for k, v in self.feeds[0].items()} if self.feeds else {},
        }


def free_dimensions(
    model: ir.Model, dims: dict[str, int] | None = None, shapes: dict | None = None
) -> bool:
    """Whether some dynamic dimension of the inputs is sized by neither ``dims`` nor ``shapes``."""
    dims = dims or {}
    shapes = shapes or {}
    for value in model.graph.inputs:
        if value.name in model.graph.initializers or value.name in shapes or value.shape is None:
            continue
        for d in value.shape:
            if static_dim(d) is None and d != 0 and dim_name(d) not in dims:
                return True
    return False


def _batch_names(model: ir.Model) -> set[str]:
    """Names of the dimensions that lead some rank >= 2 input."""
    names = set()
    for value in model.graph.inputs:
        if value.shape is not None and len(value.shape) >= 2:
            name = dim_name(value.shape[0])
            if name is not None and static_dim(value.shape[0]) is None:
                names.add(name)
    return names


Tie = tuple[str, int | str]  # ("name", dim name) or (input name, axis) of an anonymous dimension


def _tie_of(value: ir.Value, axis: int, name: str | None) -> Tie:
    return ("name", name) if name is not None else (value.name, axis)


def _is_batch(value: ir.Value, axis: int, name: str | None, batch_names: set[str]) -> bool:
    if name is not None:
        return name in batch_names
    return axis == 0 and len(value.shape) >= 2


def _sizer(model: ir.Model, batch: int, other: int, tied: frozenset[Tie] = frozenset()):
    batch_names = _batch_names(model)

    def free(value: ir.Value, axis: int, name: str | None) -> int:
        if _is_batch(value, axis, name, batch_names) or _tie_of(value, axis, name) in tied:
            return batch
        return other

    return free


def _tie_candidates(model: ir.Model, dims: dict, shapes: dict) -> list[Tie]:
    """The free dimensions, not batches themselves, that a failing candidate may tie to the batch."""
    batch_names = _batch_names(model)
    out: list[Tie] = []
    for value in model.graph.inputs:
        if value.name in model.graph.initializers or value.name in shapes or value.shape is None:
            continue
        for axis, d in enumerate(value.shape):
            name = dim_name(d)
            if static_dim(d) is not None or d == 0 or name in dims:
                continue
            tie = _tie_of(value, axis, name)
            if not _is_batch(value, axis, name, batch_names) and tie not in out:
                out.append(tie)
    return out


def _tie_label(tie: Tie) -> str:
    kind, key = tie
    return str(key) if kind == "name" else f"{kind}[{key}]"


_ORT_NOISE = [
    (re.compile(r"\[ONNXRuntimeError\] : \d+ : \w+ : "), ""),
    (
        re.compile(
            r"Non-zero status code returned while running (\w+) node\. Name:'([^']*)' Status Message: "
        ),
        r"\1 node '\2': ",
    ),
    (re.compile(r"/onnxruntime_src/\S+ \S+ "), ""),
    (re.compile(r"^the model failed to run: "), ""),
]


def _first_line(exc: BaseException) -> str:
    """The first line of a runtime's error, without ONNX Runtime's boilerplate."""
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    for pattern, repl in _ORT_NOISE:
        text = pattern.sub(repl, text)
    return text[:200]


def fit_inputs(
    model: ir.Model,
    run: Runner,
    *,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
    input_sets: int | None = None,
    seed: int = 0,
    max_bytes: int = MAX_INPUT_BYTES,
    runs: int | None = None,
) -> FittedInputs:
    """``input_sets`` (2) generated input sets on which ``run`` (the original model) succeeds.

    ``run(feeds) -> outputs`` raises on failure. Sizes the caller gave (``dims`` by name, ``shapes``
    per input) are kept; free dynamic dimensions follow ``CANDIDATES``. Raises ``InputError`` when
    the original fails at every size. ``runs`` is the old name of ``input_sets``.
    """
    input_sets = renamed(input_sets, runs, new="input_sets", old="runs")
    input_sets = 2 if input_sets is None else input_sets
    if input_sets < 1:
        raise InputError("`input_sets` must be at least 1: there is nothing to compare on")
    dims = dims or {}
    shapes = shapes or {}
    candidates = CANDIDATES if free_dimensions(model, dims, shapes) else (None,)
    ties = _tie_candidates(model, dims, shapes)
    failed: list[tuple[tuple[int, int], str]] = []
    for size in candidates:
        # the candidate as the rule sizes it, then with each other free dimension tied to the batch
        variants = [frozenset()]
        if size is not None and size[0] != size[1]:
            variants += [frozenset({tie}) for tie in ties]
        error = None
        for tied in variants:
            free = _sizer(model, *size, tied) if size else None
            try:
                planned = planned_shapes(
                    model, dims=dims, shapes=shapes, free=free, max_bytes=max_bytes
                )
            except InputError:
                if tied:
                    continue  # this tie asks for more memory; the others may not
                if not failed:
                    raise
                # larger sizes would pass the memory budget: the search ends here
                raise _cannot_run(None, failed[-1][1], failed) from None
            feeds_list = [
                generate_inputs(model, shapes=planned, seed=seed + i) for i in range(input_sets)
            ]
            try:
                outputs = [run(feeds) for feeds in feeds_list]
            except Exception as exc:  # noqa: BLE001 - any runtime's error: the model refused these sizes
                if size is None:
                    raise _cannot_run(feeds_list[0], _first_line(exc), []) from None
                error = error or _first_line(exc)
                continue
            return FittedInputs(
                feeds=feeds_list,
                outputs=outputs,
                size=size,
                failed=failed,
                tied=[_tie_label(t) for t in tied],
            )
        failed.append((size, error))
    raise _cannot_run(None, failed[-1][1], failed)


def _cannot_run(feeds, why: str, failed) -> InputError:
    if failed:
        sizes = [str(other) for (_, other), _ in failed]
        tried = (
            f"free dynamic dimensions at {', '.join(sizes[:-1])} and {sizes[-1]}, batch 1 past 2"
        )
    else:
        tried = ", ".join(f"{k}={list(v.shape)}" for k, v in (feeds or {}).items())
    return InputError(
        f"the original model cannot run on generated inputs (tried {tried}): {why}; "
        "give real inputs (`inputs`) or the sizes of its dynamic dimensions (`dims`)"
    )
