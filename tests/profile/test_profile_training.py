"""Training memory and FLOPs against the standard per-parameter accounting."""

from __future__ import annotations

import pytest

from modelpress.errors import OptionError
from modelpress.profile import training_flops, training_memory


@pytest.mark.parametrize(
    ("precision", "optimizer", "per_param"),
    [
        ("fp16", "adam", 16),  # 2 weights + 2 grads + 4 master + 8 Adam moments (ZeRO paper)
        ("bf16", "adam", 16),
        ("fp32", "adam", 16),  # 4 + 4 + 8
        ("fp32", "sgd", 8),
        ("fp32", "momentum", 12),
        ("fp16", "sgd", 8),  # 2 + 2 + 4 master
        ("fp8", "adam", 16),  # fp8 training keeps 16-bit weights and gradients
    ],
)
def test_bytes_per_parameter(precision, optimizer, per_param):
    mem = training_memory(1_000_000, precision=precision, optimizer=optimizer)
    assert mem.total == per_param * 1_000_000
    assert mem.activations == 0


def test_activations_at_compute_precision():
    mem = training_memory(10, precision="bf16", activation_elems=1000)
    assert mem.activations == 2000
    assert mem.total == 16 * 10 + 2000


def test_training_flops_is_three_forwards():
    assert training_flops(5e9) == 15e9


def test_unknown_optimizer_or_precision():
    with pytest.raises(OptionError, match="optimizer 'lamb'"):
        training_memory(1, precision="fp16", optimizer="lamb")
    with pytest.raises(OptionError, match="`precision` 'fp4'"):
        training_memory(1, precision="fp4")
