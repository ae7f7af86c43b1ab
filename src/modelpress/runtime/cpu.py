"""What this CPU's int8 kernels compute: exact sums, or pair sums that saturate.

ONNX Runtime multiplies uint8 activations by int8 weights (every int8 Conv, MatMul and Gemm, and
dynamic quantization's MatMulInteger) with the widest instruction the CPU has:

- with AVX-512 VNNI, AVX-VNNI or AMX on x86, and on ARM64, products are summed in int32: exact;
- with only AVX2 (or AVX-512 without VNNI), ``vpmaddubsw`` adds each pair of neighbouring products
  in int16 *with saturation*: ``255·127 + 255·127`` comes out as 32767 instead of 64770.

The instruction set tells which family a CPU is in; a tiny ``MatMulInteger`` run through ONNX
Runtime (``probe``) tells what the kernels actually do, and wins when the two disagree (a runtime
built without a kernel, an emulator, a hypervisor that hides flags).

Targets name the formats ``quantize --target-cpu`` writes for: ``vnni`` (exact x86), ``arm64``
(exact), ``avx2`` (saturating x86) and ``portable`` (safe on all of them).
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelpress.errors import OptionError
from modelpress.ir import parse
from modelpress.runtime.ort import session

# Targets whose int8 kernels sum exactly; the others need weights whose pair sums cannot saturate.
EXACT_TARGETS = ("vnni", "arm64")
SATURATING_TARGETS = ("avx2", "portable")
TARGETS = (*EXACT_TARGETS, *SATURATING_TARGETS)
# x86 flags (as /proc/cpuinfo spells them) that give exact u8·s8 dot products.
EXACT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


@dataclass(frozen=True)
class Int8Capability:
    """This machine's int8 arithmetic: ``target`` (one of ``TARGETS``), whether its sums are
    exact, what the instruction set says and what the probe measured (None when it could not)."""

    target: str
    exact: bool
    arch: str
    flags: tuple[str, ...]
    probe_exact: bool | None

    def describe(self) -> str:
        how = "exact int32 sums" if self.exact else "int16 pair sums that saturate"
        isa = ", ".join(self.flags) or "no VNNI/AMX"
        if self.probe_exact is not None and self.probe_exact != bool(self.flags):
            isa += ", but ONNX Runtime's kernel measured otherwise"
        return f"{self.target} ({self.arch}, {isa}: {how})"

    def to_dict(self) -> dict:
        return {
            "target": self.target,
            "exact": self.exact,
            "arch": self.arch,
            "flags": list(self.flags),
            "probe_exact": self.probe_exact,
        }


def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux ``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def probe() -> bool | None:
    """Whether ONNX Runtime's u8·s8 kernel sums exactly here: ``MatMulInteger`` of two 255s by
    two 127s is 64770 when exact and 32767 when pairs saturate. None if it cannot run."""

    text = """<ir_version: 8, opset_import: ["" : 13]>
    probe (uint8[1, 2] a) => (int32[1, 1] y) <int8[2, 1] b = {127, 127}> { y = MatMulInteger(a, b) }"""
    try:
        out = session(parse(text), optimize="all").run(None, {"a": np.full((1, 2), 255, np.uint8)})
    except Exception:  # noqa: BLE001 - no kernel: the instruction set decides alone
        return None
    return int(out[0].reshape(())) == 2 * 255 * 127


@functools.cache
def int8_capability() -> Int8Capability:
    """This machine's capability, measured once per process."""
    arch = platform.machine().lower()
    flags = cpu_flags()
    exact_flags = tuple(f for f in EXACT_FLAGS if f in flags)
    measured = probe()
    if arch in ("arm64", "aarch64"):
        exact, target = True if measured is None else measured, "arm64"
    else:
        exact = bool(exact_flags) if measured is None else measured
        target = "vnni" if exact else "avx2"
    if not exact and target == "arm64":
        target = "portable"
    return Int8Capability(target, exact, arch, exact_flags, measured)


def resolve_target(target: str) -> str:
    """``auto`` → this machine's target; a named target is checked and returned."""
    if target == "auto":
        return int8_capability().target
    if target not in TARGETS:
        raise OptionError(f"`target_cpu` {target!r}: choose auto, {', '.join(TARGETS)}")
    return target


def is_exact(target: str) -> bool:
    return target in EXACT_TARGETS


# The model metadata key that records the target a quantized model's int8 formats were made for.
TARGET_METADATA_KEY = "modelpress.int8_target"


def target_warning(metadata: dict[str, str]) -> str | None:
    """A warning when a model whose int8 weights assume exact sums runs on a saturating CPU."""
    target = metadata.get(TARGET_METADATA_KEY)
    if target not in EXACT_TARGETS:
        return None
    here = int8_capability()
    if here.exact:
        return None
    return (
        f"this model's int8 weights were made for {target} CPUs (exact sums), but this CPU's "
        f"int8 kernels saturate ({here.describe()}): outputs may be wrong; re-quantize with "
        "--target-cpu auto or portable"
    )
