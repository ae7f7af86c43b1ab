"""Decoder LLMs to ONNX with their KV cache: a Hugging Face folder or a GGUF in, an LLM folder out.

``convert_llm(source, output=...)`` (also reached through ``modelpress.convert`` and
``modelpress convert CHECKPOINT -o LLM_DIR``). The folder's layout and the decoder's interface are
``modelpress.ir.llm``'s; ``FAMILIES`` is the registry of the architectures it reads.
"""

from modelpress.convert.llm.api import LEVELS, LLMConvertResult, convert_llm
from modelpress.convert.llm.families import FAMILIES, supported

__all__ = ["FAMILIES", "LEVELS", "LLMConvertResult", "convert_llm", "supported"]
