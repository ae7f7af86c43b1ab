"""Device names and the choice of a device.

A device is written ``cpu``, ``cuda``/``cuda:N``, ``mps``, or an accelerator a backend names itself
(``tensorrt``, ``openvino``). ``auto`` means the best device the backend has here. A device that is
not present gives a warning and the CPU (soft placement), or a ``DeviceError`` when placement is strict.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelpress.errors import ModelpressError, OptionError


class DeviceError(ModelpressError):
    """A device that was asked for strictly is not present."""


def normalize(device: str) -> str:
    d = device.strip().lower()
    if d == "gpu" or d == "cuda":
        return "cuda:0"
    if d.startswith("cuda:"):
        if not d[5:].isdigit():
            raise OptionError(f"device {device!r}: expected cuda:N with N an integer")
        return d
    if d in ("cpu", "mps", "auto") or d.isidentifier():
        return d
    raise OptionError(
        f"device {device!r}: expected auto, cpu, cuda, cuda:N, mps or a backend's device name"
    )


@dataclass(frozen=True)
class DeviceChoice:
    requested: str
    device: str
    warning: str | None = None


def choose(
    requested: str, available: list[str], *, strict: bool = False, backend: str = ""
) -> DeviceChoice:
    """Pick a device from ``available`` (best first; the CPU always last) for ``requested``."""
    req = normalize(requested)
    if req == "auto":
        return DeviceChoice(requested, available[0])
    if req in available:
        return DeviceChoice(requested, req)
    where = f" to the {backend} backend" if backend else ""
    message = f"device {requested!r} is not available{where} (available: {', '.join(available)})"
    if strict:
        raise DeviceError(message)
    return DeviceChoice(requested, "cpu", warning=message + "; running on cpu")
