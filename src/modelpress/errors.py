"""Errors meant for people.

A user's mistake raises a ``ModelpressError`` subclass whose message names the file, node or option
and what to do. The CLI prints ``error: <message>`` on one line and exits with code 1; internal
invariants may still ``assert``.
"""

from __future__ import annotations


class ModelpressError(Exception):
    """Base class of every error a user can cause."""


class ModelLoadError(ModelpressError):
    """A model file is missing, truncated, not ONNX, or not a valid graph."""


class ModelSaveError(ModelpressError):
    """A model could not be written (missing directory, no permission, invalid graph)."""


class InputError(ModelpressError):
    """Inputs given to a model (names, shapes, dtypes, files) do not match what it expects."""


class OptionError(ModelpressError):
    """An option has a value that cannot be used (unknown pass, bad shape string, ...)."""


class ConversionError(ModelpressError):
    """A model could not be converted to ONNX (unreadable source, unsupported op or construct)."""


class VerificationError(ModelpressError):
    """Two models that should compute the same thing do not."""


class MissingExtraError(ModelpressError):
    """An optional dependency is needed and not installed."""

    def __init__(self, package: str, extra: str, purpose: str):
        super().__init__(
            f"{purpose} needs the '{package}' package: install it with "
            f"`pip install 'modelpress[{extra}]'`"
        )


def require(module: str, *, extra: str, purpose: str):
    """Import an optional module, or raise MissingExtraError naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingExtraError(module.split(".")[0], extra, purpose) from exc


def lazy_exports(package: str, modules: dict[str, list[str]]):
    """``(__getattr__, __dir__, __all__)`` for a package whose names load their module on first
    use (PEP 562): ``modules`` maps a module of the package (``"io"`` for ``<package>.io``) to the
    names it gives. Importing the package then imports nothing more, so that a process loads only
    what it runs (a server of LLM folders never loads onnx or onnx_ir)."""
    import importlib
    import sys

    home = {name: f"{package}.{module}" for module, names in modules.items() for name in names}

    def __getattr__(name: str):
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home[name]), name)
        setattr(sys.modules[package], name, value)  # the next access finds it without this
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *home})

    return __getattr__, __dir__, sorted(home)


def renamed(value, old_value, *, new: str, old: str):
    """The value of argument ``new`` given under its old name ``old`` (a DeprecationWarning), or
    under its own; an ``OptionError`` when both are given."""
    if old_value is None:
        return value
    if value is not None:
        raise OptionError(f"`{old}` is the old name of `{new}`: give only `{new}`")
    import warnings

    warnings.warn(f"`{old}` is renamed `{new}`", DeprecationWarning, stacklevel=3)
    return old_value
