"""Peak memory of protecting and of opening a big model, each in a fresh process (its peak RSS,
``VmHWM``, less the RSS of the same process once its imports are done), as a multiple of the
model's size. Run by ``bench_protect.py``; by hand:

    .venv/bin/python benchmarks/protect_memory.py build MLP.onnx --mib 1100
    .venv/bin/python benchmarks/protect_memory.py run MLP.onnx STEP KEYFILE [OUT]

STEP: ``encrypt`` (protect without obfuscation, the check after it included), ``obfuscate``
(runtime mode, the check included), ``storage`` (obfuscation in storage mode, the check
included), ``open`` (``open_package``, a session and one run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np


def build(path: Path, mib: int, width: int = 4096) -> Path:
    """A wide MLP of about ``mib`` MiB: MatMul + Add + Relu layers of ``width`` x ``width``."""
    from modelpress.zoo.mlp import wide_mlp

    layers = max(1, round(mib * 2**20 / (4 * width * width)))
    return wide_mlp(path, width=width, layers=layers)


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _rss_kib() -> int:
    return _status_kib("VmRSS")


def _peak_kib() -> int:
    """This process's peak RSS. ``VmHWM``, not ``ru_maxrss``: the latter keeps the parent's
    peak across fork and exec, so a child of a big process reports the parent's."""
    return _status_kib("VmHWM")


def run(path: Path, step: str, key_file: Path, out: Path | None) -> dict:
    from modelpress.protect import load_key, open_package, protect
    from modelpress.runtime.ort import session

    key = load_key(key_file=key_file)
    base = _rss_kib()
    if step == "encrypt":
        protect(path, key=key, output=out)
    elif step == "obfuscate":
        protect(path, key=key, output=out, obfuscate=True, ratio=0.1, seed=0)
    elif step == "storage":
        protect(path, key=key, output=out, obfuscate=True, ratio=0.1, seed=0, mode="storage")
    else:
        model = open_package(path, key)
        width = model.graph.inputs[0].shape[1]
        session(model).run(None, {"x": np.ones((1, width), np.float32)})
    peak = _peak_kib()
    return {"step": step, "baseline_mib": base / 1024, "peak_mib": peak / 1024}


def measure(path: Path, step: str, key_file: Path, out: Path | None, size: int) -> dict:
    """``run`` in a fresh process; the peak over the baseline as a multiple of ``size`` bytes."""
    argv = [sys.executable, __file__, "run", str(path), step, str(key_file)]
    argv += [str(out)] if out is not None else []
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ})
    if done.returncode != 0:
        return {"step": step, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    r = json.loads(done.stdout.strip().splitlines()[-1])
    r["model_mib"] = size / 2**20
    r["ratio"] = (r["peak_mib"] - r["baseline_mib"]) / r["model_mib"]
    return r


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(Path(sys.argv[2]), int(sys.argv[sys.argv.index("--mib") + 1]))
    else:
        out = Path(sys.argv[5]) if len(sys.argv) > 5 else None
        print(json.dumps(run(Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4]), out)))
