"""Backends (ONNX Runtime, PyTorch), device placement with fallback, sessions, batch inference."""
