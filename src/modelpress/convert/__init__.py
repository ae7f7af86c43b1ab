"""Framework models in, verified standard ONNX out.

``convert(src, ...)`` accepts PyTorch (``nn.Module``, ``.pt2``, TorchScript ``.pt``) and TensorFlow/Keras
(SavedModel, ``.keras``, ``.h5``, ``.tflite``) models; ``SOURCE_KINDS`` is the registry of what it
accepts. Frameworks are imported only when a model of theirs is converted.
"""

from modelpress.convert.api import ConvertResult, convert, verify_against_source
from modelpress.convert.base import InputSpec, parse_dynamic, parse_input_specs
from modelpress.convert.kinds import SOURCE_KINDS, detect
from modelpress.errors import ConversionError

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
