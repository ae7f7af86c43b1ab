"""Post-training quantization: observers, calibration, and the static, dynamic, weight-only and
float16 modes, with a per-layer error report and an accuracy budget (see ``api.quantize``)."""

from modelpress.compress.quantize.api import MODES, QuantizeResult, quantize
from modelpress.compress.quantize.calibration import CalibrationSet, ImagePreprocess
from modelpress.compress.quantize.qparams import PerChannel, PerGroup, PerTensor, QParams

__all__ = [
    "MODES",
    "CalibrationSet",
    "ImagePreprocess",
    "PerChannel",
    "PerGroup",
    "PerTensor",
    "QParams",
    "QuantizeResult",
    "quantize",
]
