"""Pruning: structured (dependency groups found on the ONNX graph, removed physically) and
unstructured (global or per-layer magnitude, 2:4 semi-structured)."""
