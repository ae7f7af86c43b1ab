"""``protect``, ``open_package``, ``is_package``: the protect layer's public functions.

    key = load_key(key_file="key.bin")
    result = protect(model, key=key, output="model.mpk", obfuscate=True, ratio=0.3)
    model = open_package("model.mpk", key)        # the model that runs, in memory only

``protect`` writes an encrypted package (``.mpk``), or with ``encrypt=False`` the obfuscated
graph as an ONNX file (its operator library still sealed inside), then opens what it wrote and
checks it against the original on generated inputs, and measures the obfuscation
(``metrics.py``). Nothing it decrypts is ever written to disk.
"""

from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelLoadError, ModelpressError, OptionError, VerificationError
from modelpress.ir import from_bytes, load, model_bytes, save
from modelpress.ir.files import atomic, output_dir
from modelpress.protect import library as lib
from modelpress.protect import package, payload, signature
from modelpress.protect.keys import check_key, key_id
from modelpress.protect.metrics import ProtectionMetrics, measure
from modelpress.protect.obfuscate import obfuscate as run_obfuscation
from modelpress.verify import verify

DEFAULT_RATIO = 0.1
VERIFY_RTOL = 1e-5


@dataclass
class ProtectResult:
    output: str | None
    mode: str
    encrypted: bool
    obfuscated: bool
    key_id: str
    bytes: int
    seconds: float
    ratio: float | None = None
    seed: int | None = None
    chunks: int | None = None
    chunk_size: int | None = None
    groups: int | None = None
    decoys: int | None = None
    visible_weights: int | None = None
    library_constants: int | None = None
    metrics: ProtectionMetrics | None = None
    verification: dict | None = None
    notes: list[str] = field(default_factory=list)
    data: bytes | None = field(default=None, repr=False)  # the package, when no output was given

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("data", "metrics")}
        d["metrics"] = self.metrics.to_dict() if self.metrics else None
        return d


def _as_model(model) -> ir.Model:
    if isinstance(model, ir.Model):
        return model
    if isinstance(model, (str, os.PathLike)):
        return payload.load_original(model)
    raise OptionError(f"protect needs an onnx_ir.Model or a path, not {type(model).__name__}")


def _is_big(model: ir.Model) -> bool:
    total = 0
    for graph in model.graphs():
        for v in graph.initializers.values():
            total += v.const_value.nbytes if v.const_value is not None else 0
    return total > 1_800_000_000


def protect(
    model: ir.Model | str | os.PathLike,
    *,
    key: bytes,
    output: str | os.PathLike | None = None,
    obfuscate: bool = False,
    ratio: float = DEFAULT_RATIO,
    seed: int | None = None,
    mode: str | None = None,
    encrypt: bool = True,
    rename_io: bool = False,
    chunk_size: int = package.DEFAULT_CHUNK,
    verify: bool = True,
    inputs: dict[str, np.ndarray] | None = None,
) -> ProtectResult:
    """Protect ``model`` with ``key``: encrypt it, obfuscate it, or both.

    ``mode``: ``"runtime"`` (default with ``obfuscate``: the obfuscated graph is what runs) or
    ``"storage"`` (the original is restored in memory when opened; the only mode without
    ``obfuscate``). ``encrypt=False`` writes the obfuscated ONNX graph instead of a package.
    ``verify``: open the result and compare its outputs with the original's (relative 1e-5), on
    ``inputs`` (arrays by input name) or on inputs generated to fit the model.
    """
    started = time.perf_counter()
    key = check_key(key)
    mode = mode or ("runtime" if obfuscate else "storage")
    if mode not in lib.MODES:
        raise OptionError(f"--mode {mode!r}: one of {', '.join(lib.MODES)}")
    if not obfuscate and mode == "runtime":
        raise OptionError("--mode runtime runs the obfuscated graph: it needs --obfuscate")
    if not encrypt and not obfuscate:
        raise OptionError("--no-encrypt writes the obfuscated graph: it needs --obfuscate")
    if not 1 <= chunk_size <= package.MAX_CHUNK:
        raise OptionError(f"--chunk-size {chunk_size}: must be between 1 and {package.MAX_CHUNK}")
    if output is not None:
        output_dir(output)
    original = _as_model(model)
    owned = original is not model  # read here from a file: the check may let its weights go
    if lib.is_obfuscated(original):
        raise OptionError(
            "the model is already protected (an obfuscated graph): protect the original"
        )
    big = _is_big(original)
    result = ProtectResult(
        output=str(output) if output is not None else None,
        mode=mode,
        encrypted=encrypt,
        obfuscated=obfuscate,
        key_id=key_id(key).hex(),
        bytes=0,
        seconds=0.0,
    )
    content = original
    if obfuscate:
        if big:
            raise OptionError(
                "obfuscation holds the model in memory in one protobuf: models over 1.8 GB can be encrypted, not obfuscated"
            )

        done = run_obfuscation(
            original, key=key, ratio=ratio, seed=seed, mode=mode, rename_io=rename_io
        )
        content = done.model
        result.ratio, result.seed = ratio, done.seed
        result.groups, result.decoys = done.groups, done.decoys
        result.visible_weights, result.library_constants = (
            done.visible_weights,
            done.library_constants,
        )

        done = None
        gc.collect()  # what obfuscation left behind (graphs hold reference cycles)
        result.metrics = measure(original, content, interface_kept=not rename_io)
        _release(original)
        gc.collect()

    check = verify and not big
    if big and verify:
        result.notes.append("not verified: models over 1.8 GB cannot run from memory")
    if encrypt:
        size, segments = payload.model_stream(content)
        # the stream holds the model's tensors until it is used up; then only `original` is kept
        content = None
        result.chunk_size = chunk_size
        if output is None:
            buf = bytearray()
            header = package.encrypt_stream(segments, size, key, buf.extend, chunk_size=chunk_size)
            segments = None
            gc.collect()  # the graph's reference cycles keep its tensors until collected
            result.data = bytes(buf)
            del buf
            if check:
                result.verification = _verify(
                    original, result.data, key, inputs=inputs, owned=owned
                )
        else:
            # Checked from the staged file before it takes the output's place: a package that
            # fails its check is never left behind.
            with atomic(output) as f:
                header = package.encrypt_stream(segments, size, key, f.write, chunk_size=chunk_size)
                segments = None
                gc.collect()  # the graph's reference cycles keep its tensors until collected
                f.flush()
                if check:
                    result.verification = _verify(
                        original, f.name, key, name=str(output), inputs=inputs, owned=owned
                    )
        result.chunks = header.chunk_count
        result.bytes = header.file_size
    else:
        data = model_bytes(content)
        if check:
            result.verification = _verify(
                original, data, key, name=str(output or "model"), inputs=inputs
            )
        if output is None:
            result.data = data
            result.bytes = len(data)
        else:
            save(content, output)
            result.bytes = Path(output).stat().st_size
    result.seconds = time.perf_counter() - started
    return result


def _verify(
    original: ir.Model,
    written,
    key: bytes,
    *,
    name: str | None = None,
    inputs=None,
    owned: bool = False,
) -> dict:
    """Open what was written and compare it with the original on generated inputs. The original
    runs first, and its weights are let go before what was written is opened: the two are never
    in memory together (``owned``: the original was read by ``protect`` itself, and its weights in
    memory are dropped too)."""

    def opened() -> ir.Model:
        _release(original, drop=owned)
        return open_package(written, key, name=name)

    try:
        check = verify(original, opened, data=inputs, input_sets=2, rtol=VERIFY_RTOL)
    except ModelpressError as exc:
        raise VerificationError(
            f"the protected model could not be checked against the original ({exc}); "
            "give inputs it runs on with --data, or skip the check with --no-verify"
        ) from None
    if not check.passed:
        raise VerificationError(
            f"the protected model does not compute the original's outputs (max relative error {check.max_rel:.3g}); "
            "please report this model"
        )
    return {"passed": True, "max_rel": check.max_rel, "runs": check.runs, "rtol": VERIFY_RTOL}


def _release(model: ir.Model, *, drop: bool = False) -> None:
    """Unmap the weights of a model read lazily from disk (they are mapped again when next read),
    so that the pages read so far stop counting in the process's memory; with ``drop``, the
    weights held in memory go too (the model is no longer usable)."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if drop and not isinstance(value.const_value, ir.ExternalTensor):
                value.const_value = None
            elif isinstance(value.const_value, ir.ExternalTensor):
                try:
                    value.const_value.release()
                except BufferError:  # an array of it is still in use: it stays mapped
                    pass
    gc.collect()
    _trim()


def _trim() -> None:
    """Give the C heap's free memory back to the system (glibc keeps what ONNX Runtime and numpy
    freed, and the next big step would count it again)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def is_package(source: str | os.PathLike | bytes) -> bool:
    """Whether ``source`` is something ``open_package`` opens: an ``.mpk`` (by its signature) or
    an ONNX file whose graph is obfuscated (it carries a sealed operator library)."""
    if package.has_magic(source):
        return True
    try:
        if isinstance(source, (bytes, bytearray, memoryview)):
            model = from_bytes(source)
        else:
            model = payload.load_lazily(source)
    except ModelLoadError:
        return False
    return lib.is_obfuscated(model)


def open_package(
    source: str | os.PathLike | bytes, key: bytes, *, name: str | None = None
) -> ir.Model:
    """The model that runs, in memory: storage mode gives the original model; runtime mode the
    obfuscated graph with its decrypted operator library as local functions."""
    key = check_key(key)
    label = name or (str(source) if isinstance(source, (str, os.PathLike)) else "package")
    is_path = isinstance(source, (str, os.PathLike))
    if package.has_magic(source) or (is_path and Path(source).suffix == ".mpk"):
        model = payload.read_model(package.decrypt_stream(source, key, name=label), name=label)
    elif isinstance(source, (bytes, bytearray, memoryview)):
        model = from_bytes(source, source=label)
    else:
        model = load(source)
    return unlock(model, key, name=label)


def unlock(model: ir.Model, key: bytes, *, name: str = "model") -> ir.Model:
    """An obfuscated model already in memory, opened with ``key`` (``model`` itself is used up);
    any other model is returned as it is."""
    if not lib.is_obfuscated(model):
        return model
    label = name
    signature.check(model, check_key(key), name=label)
    library = lib.take(model, key, name=label)
    if library.mode == "storage":
        return lib.restore(model, library, name=label)
    return lib.attach(model, library)
