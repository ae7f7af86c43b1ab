"""ONNX Runtime's own int8 kernels on an x86 CPU without VNNI, whatever CPU runs the suite.

``qemu-x86_64 -cpu Haswell`` (Debian's qemu-user; ``make test`` installs it) runs this Python on
an emulated AVX2 CPU: ONNX Runtime then picks the kernels that add u8·s8 products in saturating
int16 pairs, as on a real AVX2 machine. One emulated process checks what the rest of the suite can
only emulate in numpy: the capability probe, the formats ``auto`` chooses there, the check that
catches a model made for exact CPUs, and the warning a session gives for it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

QEMU = shutil.which("qemu-x86_64")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        QEMU is None or platform.machine() != "x86_64",
        reason="needs qemu-user on x86_64 (make test installs it)",
    ),
]

SCRIPT = r"""
import json, numpy as np
from modelpress.runtime.ort import use_global_thread_pool
use_global_thread_pool(1)  # one ONNX Runtime thread: qemu-user's threads are its fragile part
from quant_models import image_like, thin_stem_cnn
from modelpress.compress import quantize
from modelpress.runtime.cpu import int8_capability
from modelpress.runtime.session import Session

rng = np.random.default_rng(0)
calib = [{"x": image_like(rng, (8, 1, 8, 8)) * 4} for _ in range(3)]
model = thin_stem_cnn(residual=True)
out = {"cpu": int8_capability().to_dict()}
for target in ("auto", "vnni"):
    r = quantize(model, mode="static", data=calib, target_cpu=target, gptq=False)
    out[target] = {
        "target": r.target,
        "reference": r.check.reference_error,
        "deployed": r.check.deployed_error,
        "failures": r.failures,
        "warnings": Session(r.model).warnings,
    }
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def haswell():
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "src"), str(root / "tests" / "compress"), env.get("PYTHONPATH", "")]
    )
    # numpy's own AVX2 sorting kernels crash qemu's emulation now and then; numpy falls back to
    # its baseline kernels, while ONNX Runtime's int8 kernels, the point here, keep AVX2
    env["NPY_DISABLE_CPU_FEATURES"] = "X86_V3 X86_V4"
    for _attempt in range(2):  # qemu-user itself crashes now and then (SIGSEGV): one retry
        done = subprocess.run(
            [QEMU, "-cpu", "Haswell", sys.executable, "-c", SCRIPT],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
        )
        if done.returncode != -11:
            break
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, done.stderr[-2000:]
    return json.loads(line[len("RESULT") :])


def test_the_probe_finds_saturating_sums(haswell):
    assert haswell["cpu"]["target"] == "avx2" and haswell["cpu"]["probe_exact"] is False


def test_auto_writes_pair_safe_weights_that_run_as_the_scales_imply(haswell):
    auto = haswell["auto"]
    assert auto["target"] == "avx2" and auto["failures"] == [] and auto["warnings"] == []
    assert auto["deployed"] <= 2 * auto["reference"] + 0.005


def test_a_model_for_exact_cpus_fails_the_check_and_warns_here(haswell):
    vnni = haswell["vnni"]
    assert vnni["target"] == "vnni"
    assert vnni["deployed"] > 3 * vnni["reference"]  # the stem's pair sums saturate
    assert len(vnni["failures"]) == 1 and "saturating int16 pairs" in vnni["failures"][0]
    assert "weights of stem" in vnni["failures"][0]  # the layer that overflows is named
    assert len(vnni["warnings"]) == 1 and "re-quantize with --target-cpu" in vnni["warnings"][0]
