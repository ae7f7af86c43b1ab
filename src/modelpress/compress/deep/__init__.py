"""Deep Compression: pruning with retraining, k-means weight sharing with retrained codebooks,
entropy coding into an ``.mpz`` file that ``open_mpz`` decodes to a standard ONNX model."""

from modelpress.compress.deep.mpz import decode, encode, open_mpz

__all__ = ["decode", "deep_compress", "encode", "open_mpz"]


def __getattr__(name: str):
    if name in ("deep_compress", "DeepResult"):  # needs torch; decoding an .mpz does not
        from modelpress.compress.deep import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
