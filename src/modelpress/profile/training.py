"""Training totals: FLOPs and memory of one optimisation step.

FLOPs: the backward pass computes the gradient with respect to the input *and* to the weights of
every layer, each as costly as the forward product, so one step is ≈ 3 × the forward FLOPs.

Memory (bytes per parameter, the standard accounting of the ZeRO paper, Rajbhandari et al. 2020):

| precision | weights | gradients | fp32 master copy | optimizer state          |
| --------- | ------- | --------- | ---------------- | ------------------------ |
| fp32/tf32 | 4       | 4         | none             | SGD 0, momentum 4, Adam 8 |
| mixed     | 2       | 2         | 4                | SGD 0, momentum 4, Adam 8 |

so Adam costs 16 bytes per parameter in both fp32 and mixed precision, plus the activations saved
for the backward pass (at the compute precision).
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.errors import OptionError

# fp32 state tensors each optimizer keeps per parameter (momentum buffer; Adam's two moments).
OPTIMIZER_STATES = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2}

# Bytes of one element at each precision the advisor plans for.
PRECISION_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}

BACKWARD_FLOPS_FACTOR = 2.0  # backward ≈ 2 × forward


@dataclass(frozen=True)
class TrainingMemory:
    weights: float
    gradients: float
    master_weights: float
    optimizer_state: float
    activations: float

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.master_weights
            + self.optimizer_state
            + self.activations
        )

    @property
    def per_parameter_states(self) -> float:
        """Bytes per parameter of everything but the activations."""
        return self.weights + self.gradients + self.master_weights + self.optimizer_state


def precision_bytes(precision: str) -> int:
    try:
        return PRECISION_BYTES[precision]
    except KeyError:
        raise OptionError(
            f"`precision` {precision!r}: choose one of {', '.join(PRECISION_BYTES)}"
        ) from None


def is_mixed(precision: str) -> bool:
    """Below 32 bits, training keeps an fp32 master copy of the weights (mixed precision)."""
    return precision_bytes(precision) < 4


def training_memory(
    params: float, *, precision: str, optimizer: str = "adam", activation_elems: float = 0.0
) -> TrainingMemory:
    """Bytes a training step holds: weights, gradients, master copy, optimizer state, activations."""
    if optimizer not in OPTIMIZER_STATES:
        raise OptionError(f"optimizer {optimizer!r}: choose one of {', '.join(OPTIMIZER_STATES)}")
    width = precision_bytes(precision)
    mixed = is_mixed(precision)
    # fp8 training keeps bf16 weights and gradients (Transformer Engine): never below 2 bytes
    store = max(width, 2) if mixed else 4
    return TrainingMemory(
        weights=params * store,
        gradients=params * store,
        master_weights=params * 4 if mixed else 0.0,
        optimizer_state=params * 4 * OPTIMIZER_STATES[optimizer],
        activations=activation_elems * max(width, 2),
    )


def training_flops(forward_flops: float) -> float:
    """FLOPs of one training step: forward plus a backward twice as costly."""
    return forward_flops * (1.0 + BACKWARD_FLOPS_FACTOR)


__all__ = [
    "BACKWARD_FLOPS_FACTOR",
    "OPTIMIZER_STATES",
    "PRECISION_BYTES",
    "TrainingMemory",
    "is_mixed",
    "precision_bytes",
    "training_flops",
    "training_memory",
]
