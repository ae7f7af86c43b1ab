"""Weight quantization of decoder LLM folders: int4/int8 blocks (RTN, AWQ, GPTQ, chosen per
layer by measured error on calibration text, the user's or sampled from the model itself, then
optionally tuned end to end against the float model), and GGUF blocks imported as they are."""

from modelpress.compress.llm.gguf_import import GGUFImportResult, import_gguf_blocks
from modelpress.compress.llm.quantize import LLMQuantizeResult, quantize_llm
from modelpress.compress.llm.tune import TuneOptions, TuneReport, tune_llm

__all__ = [
    "GGUFImportResult",
    "LLMQuantizeResult",
    "TuneOptions",
    "TuneReport",
    "import_gguf_blocks",
    "quantize_llm",
    "tune_llm",
]
