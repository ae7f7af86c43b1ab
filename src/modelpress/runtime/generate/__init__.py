"""Generation with a decoder LLM folder (``ir.llm``): the engine, sampling, continuous batching.

- ``folder.open_llm``: the folder's decoder in ONNX Runtime, tokenizer and chat template;
- ``chat``: the chat template, rendered as transformers renders it;
- ``cache``: the batched KV cache (rows join and leave; both ``kv_layout``s);
- ``decoder``: one model step (IO binding);
- ``sampling``: greedy, temperature, top-k, top-p, repetition penalty, seeds; value checks;
- ``text``: incremental detokenization and stop strings;
- ``sequence``: one request's state, its events and ``GenerationResult``;
- ``engine``: prefill and decode steps over the running batch;
- ``scheduler``: continuous batching, budgets, cancel, the asyncio API for the server;
- ``metrics``: counters and hooks (time to first token, inter-token latency, tokens/s);
- ``api``: ``Generator`` and ``generate()``.
"""

from modelpress.runtime.generate.api import GenerateResult, Generator, TextStream, generate
from modelpress.runtime.generate.folder import LLM, open_llm
from modelpress.runtime.generate.metrics import GenerationMetrics
from modelpress.runtime.generate.sampling import SamplingParams
from modelpress.runtime.generate.scheduler import QueueFullError, Request, Scheduler
from modelpress.runtime.generate.sequence import Event, GenerationResult

__all__ = [
    "LLM",
    "Event",
    "GenerateResult",
    "GenerationMetrics",
    "GenerationResult",
    "Generator",
    "QueueFullError",
    "Request",
    "SamplingParams",
    "Scheduler",
    "TextStream",
    "generate",
    "open_llm",
]
