"""Quantization modes: registered objects that own their algorithm, and the options they share.

A mode prepares once (calibrates, solves what needs the data) and returns a *builder*: a function
of the set of layers to keep in float that makes the quantized model. The accuracy budget calls the
builder again with more layers kept float, cheaply. ``quantize()`` looks modes up in ``MODES``; the
command line's ``--mode`` choices and the search space come from it, so a mode registered later
(QAT, say) joins both by itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.runtime.cpu import is_exact


@dataclass(frozen=True, kw_only=True)
class Options:
    """What every mode may read; each mode documents the fields it uses."""

    method: str = "minmax"  # calibration observer (static)
    per_channel: bool = True  # one weight scale per output channel
    bits: int = 8  # weight-only: 8 or 4
    block_size: int = 32  # weight-only 4-bit: elements per scale
    activation_dtype: str = "uint8"  # static: uint8 (asymmetric) or int8
    symmetric_activations: bool = False
    bias_correction: bool = True
    smooth: bool = True  # move activation outliers into the weights on attention graphs
    gptq: bool = True  # round weights by GPTQ on the calibration data
    exclude: frozenset[str] = frozenset()  # the user's float layers
    target: str = "vnni"  # the CPU the int8 formats are for (``runtime.cpu.TARGETS``), resolved
    train: object = None  # qat: the ``compress.train.TrainConfig`` (None: the mode's default)

    @property
    def pair_safe(self) -> bool:
        """Whether u8·s8 weights must keep their pair sums in int16 (``pairs``)."""
        return not is_exact(self.target)


@dataclass
class Built:
    """What a mode's builder makes for one set of float layers."""

    model: ir.Model
    layers: list[str]  # the layers quantized
    pairs: dict[str, tuple[str, str]]  # layer → (float tensor, quantized tensor) to compare
    notes: list[str] = field(default_factory=list)
    # the float model that ``layers`` and ``pairs`` name, when the mode rewrote it (exactly) first
    reference: ir.Model | None = None

    @classmethod
    def at_outputs(
        cls, reference: ir.Model, model: ir.Model, layers: list[str], notes: list[str] | None = None
    ) -> Built:
        """``model`` with ``layers`` quantized, each compared with ``reference`` (the float model
        the mode worked on) at its first output, which keeps its name."""
        return cls(model, layers, node_outputs(reference, layers), notes or [], reference)


Builder = Callable[[frozenset[str]], Built]
# A mode may rank layers by sensitivity more cheaply than quantizing them one at a time.
Ranker = Callable[[list[dict[str, np.ndarray]]], dict[str, float]]


@dataclass
class Prepared:
    build: Builder
    candidates: list[str]  # every layer the mode can quantize (the report's rows)
    notes: list[str] = field(default_factory=list)
    rank: Ranker | None = None
    training: object = None  # a mode that trains (qat): its ``compress.train.TrainResult``


class Mode:
    """A quantization mode. Subclasses set the class attributes and implement ``prepare``."""

    name: str = ""
    help: str = ""
    order: int = 100  # where the mode is listed (``--help``, the search space)
    needs_calibration: bool = False
    uses_observer: bool = False  # whether ``Options.method`` applies
    # said when a model has nothing this mode quantizes (None: say nothing)
    nothing_to_quantize: str | None = None

    def int8_layers(self, model: ir.Model, options: Options) -> bool:
        """Whether the mode writes int8 layers whose form needs ``INT8_OPSET`` (an older model
        is upgraded first)."""
        return False

    def prepare(
        self, model: ir.Model, cal, options: Options, progress
    ) -> Prepared:  # pragma: no cover
        raise NotImplementedError


MODES: dict[str, Mode] = {}


def mode_names() -> list[str]:
    """The registered modes in their listing order."""
    return sorted(MODES, key=lambda name: (MODES[name].order, name))


def register(cls: type[Mode]) -> type[Mode]:
    """Class decorator: one instance of the mode under ``cls.name``."""
    assert cls.name and cls.name not in MODES, f"duplicate or empty mode name {cls.name!r}"
    MODES[cls.name] = cls()
    return cls


def get_mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise OptionError(f"`mode` {name!r}: choose one of {', '.join(MODES)}") from None


def node_outputs(model: ir.Model, names: list[str]) -> dict[str, tuple[str, str]]:
    """Each layer's first output that is there (an LSTM may leave its ``Y`` out), to compare."""
    by = {n.name: n for n in model.graph}
    out = {}
    for name in names:
        y = next((v.name for v in by[name].outputs if v.name), None) if name in by else None
        if y:
            out[name] = (y, y)
    return out
