"""Post-training quantization: observers, calibration, modes as registered objects (static,
dynamic, weight-only, fp16, bf16), int8 formats per target CPU, the QDQ builder, a per-layer error
report, a check of the result as it will run, and an accuracy budget (see ``api.quantize``)."""

from modelpress.compress.quantize.api import QuantizeResult, quantize
from modelpress.compress.quantize.calibration import CalibrationSet, ImagePreprocess
from modelpress.compress.quantize.modes import MODES, Mode, Options, register
from modelpress.compress.quantize.qparams import PerChannel, PerGroup, PerTensor, QParams

__all__ = [
    "MODES",
    "CalibrationSet",
    "ImagePreprocess",
    "Mode",
    "Options",
    "PerChannel",
    "PerGroup",
    "PerTensor",
    "QParams",
    "QuantizeResult",
    "quantize",
    "register",
]
