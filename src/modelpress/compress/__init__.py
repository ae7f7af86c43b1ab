"""Compression: quantization (observers, post-training modes, accuracy budget)."""

from modelpress.compress.quantize import QuantizeResult, quantize

__all__ = ["QuantizeResult", "quantize"]
