"""Framework models in, verified standard ONNX out.

``convert(src, ...)`` accepts PyTorch (``nn.Module``, ``.pt2``, TorchScript ``.pt``) and TensorFlow/Keras
(SavedModel, ``.keras``, ``.h5``, ``.tflite``) models; ``SOURCE_KINDS`` is the registry of what it
accepts. Frameworks are imported only when a model of theirs is converted.
"""

from modelpress.convert.api import ConvertResult, convert, verify_against_source
from modelpress.convert.base import (
    SOURCE_KINDS,
    ConversionError,
    InputSpec,
    detect,
    parse_dynamic,
    parse_input_specs,
)

__all__ = [
    "SOURCE_KINDS",
    "ConversionError",
    "ConvertResult",
    "InputSpec",
    "convert",
    "detect",
    "parse_dynamic",
    "parse_input_specs",
    "verify_against_source",
]
