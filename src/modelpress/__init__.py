"""modelpress: take a trained model and make it ready for the hardware it will run on.

The Python API uses the same words as the command line: ``open`` (every form a command reads),
``load``, ``save``, ``inspect``, ``convert``, ``optimize``, ``verify``, ``quantize``, ``prune``,
``distill``, ``deep_compress``, ``Session`` (run), ``advise``, ``generate`` (an LLM folder); samples
are ``data=`` everywhere.

Every entry point loads on first use: ``import modelpress`` (and with it every ``modelpress.*``
module, the server's included) imports neither onnx_ir nor onnx, torch or transformers until a
function that needs them is reached.
"""

from __future__ import annotations

import sys
import types

from modelpress.errors import ModelpressError

__version__ = "0.1.0"

_LAZY = {
    "convert": ("modelpress.convert.api", "convert"),
    "inspect": ("modelpress.ir.stats", "graph_stats"),
    "load": ("modelpress.ir.io", "load"),
    "save": ("modelpress.ir.io", "save"),
    "optimize": ("modelpress.passes", "optimize"),
    "verify": ("modelpress.verify", "verify"),
    "Session": ("modelpress.runtime.session", "Session"),
    "quantize": ("modelpress.compress", "quantize"),
    "prune": ("modelpress.compress.prune.api", "prune"),
    "distill": ("modelpress.compress.distill", "distill"),
    "deep_compress": ("modelpress.compress.deep", "deep_compress"),
    "advise": ("modelpress.advisor", "recommend"),
    "generate": ("modelpress.runtime.generate", "generate"),
    "Generator": ("modelpress.runtime.generate", "Generator"),
}


class _Package(types.ModuleType):
    """``modelpress`` itself. The import system binds a subpackage to its parent's attribute
    once it is first imported; two subpackages share their name with the function the API gives
    (``modelpress.convert``, ``modelpress.verify``): that name stays the function."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = ["ModelpressError", "__version__", "open", *_LAZY]


def open(  # noqa: A001  (the word the commands use: modelpress.open(path))
    path,
    *,
    key: bytes | None = None,
    key_file=None,
    key_env: str | None = None,
    runnable: bool = True,
):
    """The model at ``path`` in memory (an ``onnx_ir.Model``), in any form the commands read: an
    ONNX file, a Deep Compression ``.mpz``, a protected ``.mpk`` package or an obfuscated ONNX
    file, the last two opened in memory with their key (``key``, 32 bytes, or read from
    ``key_file`` or the environment variable ``key_env``). ``runnable=False`` lets an obfuscated
    model without a key through as the file shows it (to inspect it)."""
    from pathlib import Path

    from modelpress.compress.deep import open_mpz
    from modelpress.errors import OptionError
    from modelpress.ir.io import load
    from modelpress.protect import is_obfuscated, load_key, open_package, unlock
    from modelpress.protect.package import has_magic

    p = Path(path)
    if p.suffix == ".mpz":
        return open_mpz(p)
    given = key is not None or key_file is not None or key_env is not None

    def the_key() -> bytes:
        return key if key is not None else load_key(key_file, key_env)

    if has_magic(p) or p.suffix == ".mpk":
        if not given:
            raise OptionError(f"{p}: a protected package: give its key with `key`")
        return open_package(p, the_key())
    model = load(p)
    if not is_obfuscated(model):
        return model
    if not given:
        if not runnable:
            return model
        raise OptionError(f"{p}: an obfuscated model: give its key with `key`")
    return unlock(model, the_key(), name=str(p))


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value  # the next access finds it without this function
        return value
    raise AttributeError(f"module 'modelpress' has no attribute {name!r}")
