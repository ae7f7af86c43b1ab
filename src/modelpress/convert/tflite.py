"""TensorFlow Lite flatbuffers (``.tflite``) to ONNX, with the TFLite interpreter as the reference.

A flatbuffer is read by offsets it stores itself, and neither the TFLite interpreter nor tf2onnx
checks them all: a damaged or truncated file can send either into unbounded allocation (tens of
GB) or a segmentation fault, which no ``except`` can catch. So the risky first contact (opening the
file with the interpreter, one run on zeros, and tf2onnx's conversion) happens in a child process
with a memory limit and a time limit. Only a file that passed there is opened in this process, for
the verification runs. The child writes the ONNX model into a private temporary folder.

Run as ``python -m modelpress.convert.tflite SRC OUT OPSET`` it is that child.
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from modelpress.convert.base import (
    ConversionError,
    ConvertOptions,
    Exported,
    first_line,
    reading,
)
from modelpress.convert.tensorflow import (
    DEFAULT_OPSET,
    _check_names,
    _check_ops,
    _concrete,
    _quiet,
    _tf,
    _tf2onnx,
    _to_ir,
)

# The child may use this much address space, at least; larger files get more (see _memory_limit).
MIN_MEMORY_BYTES = 6 << 30
TIMEOUT_S = 600
_CHILD_ERROR = 3  # the child's exit code for an ordinary Python exception (its message on stderr)


def _memory_limit(path: Path) -> int:
    # TensorFlow alone maps a few GB of address space; a sound model needs a few times its size.
    return max(MIN_MEMORY_BYTES, 8 * path.stat().st_size + (4 << 30))


def _check_header(path: Path) -> None:
    """Refuse, without a child process, a file that cannot be a TFLite flatbuffer at all: too
    short, without the ``TFL3`` file identifier, or with its root table outside the file."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if size < 16 or head[4:8] != b"TFL3":
        raise ConversionError(f"{path}: not a readable TFLite model (no TFL3 flatbuffer header)")
    root = int.from_bytes(head[:4], "little")
    if root + 4 > size:
        raise ConversionError(
            f"{path}: not a readable TFLite model (its root table lies past the end of the file); "
            "is it truncated?"
        )


def _convert_isolated(path: Path, opset: int):
    """The ONNX ``ModelProto`` tf2onnx makes of ``path``, made in a child process (see module)."""
    import onnx

    limit = _memory_limit(path)
    env = dict(os.environ)
    src_root = str(Path(__file__).resolve().parents[2])  # the folder holding the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src_root, env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

    def limit_memory():  # runs in the child, before Python starts
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    with tempfile.TemporaryDirectory(prefix="modelpress-tflite-") as tmp:
        out = Path(tmp) / "model.onnx"
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "modelpress.convert.tflite",
                    str(path.resolve()),
                    str(out),
                    str(opset),
                ],
                env=env,
                cwd=tmp,
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                preexec_fn=limit_memory,
            )
        except subprocess.TimeoutExpired:
            raise ConversionError(
                f"{path}: reading the TFLite model did not finish in {TIMEOUT_S} s; is the file damaged?"
            ) from None
        if proc.returncode == 0 and out.is_file():
            return onnx.load(str(out))
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        if proc.returncode == _CHILD_ERROR and lines:
            raise ConversionError(f"{path}: {lines[-1][:300]}")
        if proc.returncode < 0:
            name = signal.Signals(-proc.returncode).name
            why = f"the TFLite reader crashed ({name})"
        elif any("MemoryError" in ln or "bad_alloc" in ln for ln in lines):
            why = f"the TFLite reader needed more than {limit / 2**30:.0f} GiB"
        else:
            why = f"the TFLite reader failed (exit code {proc.returncode})"
        raise ConversionError(
            f"{path}: not a readable TFLite model ({why}); is the file truncated or damaged?"
        )


def convert_tflite(path, options: ConvertOptions) -> Exported:
    tf = _tf()
    _tf2onnx()  # a missing extra is reported here, not as a child's failure
    path = Path(path)
    opset = options.opset or DEFAULT_OPSET
    _check_header(path)
    proto = _convert_isolated(path, opset)
    with reading(path, "TFLite model"), _quiet():
        interpreter = tf.lite.Interpreter(model_path=str(path))
    in_details = interpreter.get_input_details()
    names = [d["name"] for d in in_details]
    _check_names(options, names, str(path))
    model = _to_ir(proto)
    _check_ops(model, opset, str(path))
    shapes = {
        d["name"]: _concrete(
            d["name"], [None if s < 0 else int(s) for s in d["shape_signature"]], options
        )
        for d in in_details
    }
    out_names = [v.name for v in model.graph.outputs]

    def reference(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        for d in in_details:
            interpreter.resize_tensor_input(d["index"], list(feeds[d["name"]].shape))
        interpreter.allocate_tensors()
        for d in in_details:
            interpreter.set_tensor(d["index"], np.ascontiguousarray(feeds[d["name"]]))
        interpreter.invoke()
        by_name = {
            d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()
        }
        if set(by_name) == set(out_names):
            return [by_name[n] for n in out_names]
        return list(by_name.values())

    return Exported(model=model, reference=reference, shapes=shapes, exporter="tf2onnx (tflite)")


def _child(src: str, out: str, opset: int) -> None:
    """Open ``src`` with the interpreter, run it once on zeros, convert it, save to ``out``."""
    import onnx

    tf = _tf()
    tf2onnx = _tf2onnx()
    try:
        with _quiet():
            interpreter = tf.lite.Interpreter(model_path=src)
            for d in interpreter.get_input_details():
                shape = [1 if s < 0 else int(s) for s in d["shape_signature"]]
                interpreter.resize_tensor_input(d["index"], shape)
            interpreter.allocate_tensors()
            for d in interpreter.get_input_details():
                interpreter.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
            interpreter.invoke()
    except Exception as exc:  # noqa: BLE001
        print(f"not a readable TFLite model ({first_line(exc, 200)})", file=sys.stderr)
        sys.exit(_CHILD_ERROR)
    try:
        with _quiet():
            proto, _ = tf2onnx.convert.from_tflite(src, opset=opset)
    except Exception as exc:  # noqa: BLE001
        print(f"tf2onnx could not convert the TFLite model: {first_line(exc)}", file=sys.stderr)
        sys.exit(_CHILD_ERROR)
    onnx.save(proto, out)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], int(sys.argv[3]))
