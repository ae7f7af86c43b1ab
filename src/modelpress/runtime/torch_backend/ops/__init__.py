"""Kernels of the PyTorch backend, one module per op family; importing this registers them all."""

from modelpress.runtime.torch_backend.ops import (  # noqa: F401
    activation,
    attention,
    contrib,
    control,
    conv,
    elementwise,
    gather,
    linalg,
    norm,
    quant,
    reduce,
    resize,
    rnn,
    shape,
)
