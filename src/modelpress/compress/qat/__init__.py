"""Quantization-aware training, registered as the quantization mode ``qat`` (``mode.py``):
fake quantization on static mode's QDQ graph, trained, written back into the same graph."""
