"""``Generator`` and ``generate()``: prompts or chat messages in, text (streamed or whole) out.

    gen = Generator("smollm2/", threads=4)
    for piece in (stream := gen.stream("The capital of France is", max_tokens=32)):
        print(piece, end="", flush=True)
    stream.result.tokens_per_s

    result = generate("smollm2/", ["Hello", "Bonjour"], temperature=0.7, seed=1)
    result.results[0].text

Several prompts run together with continuous batching (``max_seqs`` at a time). Without
``temperature``, ``top_k`` or ``top_p`` decoding is greedy.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from modelpress.errors import InputError
from modelpress.runtime.generate.folder import LLM, open_llm
from modelpress.runtime.generate.sampling import SamplingParams
from modelpress.runtime.generate.scheduler import Request, Scheduler
from modelpress.runtime.generate.sequence import GenerationResult


@dataclass
class GenerateResult:
    model: str
    results: list[GenerationResult]
    params: SamplingParams
    seconds: float

    def to_dict(self) -> dict:
        tokens = sum(r.completion_tokens for r in self.results)
        return {
            "model": self.model,
            "params": self.params.to_dict(),
            "prompts": [r.to_dict() for r in self.results],
            "completion_tokens": tokens,
            "seconds": self.seconds,
            "tokens_per_s": tokens / self.seconds if self.seconds > 0 else None,
        }


class TextStream:
    """The text pieces of one request as they are generated; ``result`` once it is done."""

    def __init__(self, events) -> None:
        self._events = events
        self.result: GenerationResult | None = None
        self.token_ids: list[int] = []

    def __iter__(self) -> Iterator[str]:
        for event in self._events:
            if event.token_id is not None:
                self.token_ids.append(event.token_id)
            if event.result is not None:
                self.result = event.result
            if event.text:
                yield event.text

    def close(self) -> None:
        """Stop generating (the request is cancelled)."""
        self._events.close()


class Generator:
    """An LLM folder ready to generate (``llm``: its path, or an ``LLM`` from ``open_llm``)."""

    def __init__(
        self,
        llm: LLM | str | os.PathLike,
        *,
        threads: int | None = None,
        max_seqs: int = 8,
        max_context: int | None = None,
    ) -> None:
        self.llm = llm if isinstance(llm, LLM) else open_llm(llm, threads=threads)
        self.scheduler = Scheduler(self.llm, max_seqs=max_seqs, max_context=max_context)

    def stream(
        self,
        prompt: str | None = None,
        *,
        messages: list[dict] | None = None,
        chat_template: bool = True,
        **sampling,
    ) -> TextStream:
        """One prompt (or conversation) streamed as text pieces; ``sampling``: the fields of
        ``SamplingParams`` (``max_tokens``, ``temperature``, ``top_k``, ``top_p``,
        ``repetition_penalty``, ``seed``, ``stop``, ``ignore_eos``)."""
        request = Request(
            prompt=prompt,
            messages=messages,
            params=SamplingParams(**sampling),
            chat_template=chat_template,
        )
        return TextStream(self.scheduler.stream(request))

    def generate(
        self,
        prompts: str | list[str] | None = None,
        *,
        messages: list[list[dict]] | None = None,
        chat_template: bool = True,
        **sampling,
    ) -> GenerateResult:
        """Several prompts (or conversations: ``messages``, a list of message lists) at once;
        ``sampling`` as for ``stream``."""
        params = SamplingParams(**sampling)
        if isinstance(prompts, str):
            prompts = [prompts]
        if (prompts is None) == (messages is None):
            raise InputError("give either `prompts` or `messages`")
        requests = (
            [Request(prompt=p, params=params) for p in prompts]
            if prompts is not None
            else [Request(messages=m, params=params, chat_template=chat_template) for m in messages]
        )
        if not requests:
            raise InputError("no prompts to generate from")
        start = time.perf_counter()
        results = self.scheduler.run(requests)
        return GenerateResult(str(self.llm.folder), results, params, time.perf_counter() - start)


def generate(
    llm: LLM | str | os.PathLike,
    prompts: str | list[str] | None = None,
    *,
    messages: list[list[dict]] | None = None,
    threads: int | None = None,
    max_seqs: int = 8,
    chat_template: bool = True,
    **sampling,
) -> GenerateResult:
    """Generate from ``prompts`` (or ``messages``) with the LLM folder ``llm``; ``sampling``: the
    fields of ``SamplingParams`` (``max_tokens``, ``temperature``, ``seed``, ``stop``, ...)."""
    return Generator(llm, threads=threads, max_seqs=max_seqs).generate(
        prompts, messages=messages, chat_template=chat_template, **sampling
    )
