"""Calibration text the model writes itself, for a user who brings none.

int4 with calibration (AWQ's scales, the clip search, GPTQ) needs each MatMul's inputs as the
model will see them; rounding to nearest needs nothing and loses far more. So without a text,
``quantize`` asks the float model for one, as data-free quantization-aware training does
(LLM-QAT): ``windows`` sequences of ``seq_len`` tokens, each started from one token of the
vocabulary drawn at random (special tokens left out; after the model's BOS when its prompts
take one) and continued by sampling at temperature 1 (no top-k or top-p: the model's own
distribution), the end of text ignored; seeded, so the same folder gives the same text. The
sequences are decoded and joined by blank lines: the rest of ``quantize`` reads it as it reads a
user's file.

Measured (``benchmarks/results/llm.md``), SmolLM2-135M with its residual stream rotated, scored
on Python's license, perplexity over float: block 32 +15.1% (+11.4% and +17.6% with other
draws of such text) against +69.4% rounded to nearest and +17.6% calibrated on docstrings of the
standard library; block 128 +25.2% (another draw +28.9%) against +174.8% and +33.0%. On
glassllm's trained decoder, text of the scored domain calibrated better still: a user's text
from the domain the model will serve stays the better choice (``--data``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from modelpress.errors import InputError

TEMPERATURE = 1.0
MAX_SEQS = 16  # sequences sampled together (continuous batching)


def sampled_text(
    folder: Path,
    *,
    windows: int,
    seq_len: int,
    seed: int = 0,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> str:
    """``windows`` sequences of about ``seq_len`` tokens sampled from the float LLM folder
    ``folder`` (module docstring), as one text; ``progress(tokens, total)`` as they come."""
    from modelpress.runtime.generate import open_llm

    llm = open_llm(folder, threads=threads)
    ids = sample_windows(llm, windows=windows, seq_len=seq_len, seed=seed, progress=progress)
    return "\n\n".join(llm.decode(w) for w in ids)


def sample_windows(
    llm,
    *,
    windows: int,
    seq_len: int,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """The token ids of each sampled sequence (its start token first, the BOS before it left
    out) from ``llm`` (``runtime.generate.open_llm``)."""
    from modelpress.runtime.generate import Request, SamplingParams, Scheduler

    config = llm.config
    seq_len = min(seq_len, config.max_context)
    bos = config.bos_token_id
    prefix = [bos] if config.add_bos_token and bos is not None else []
    if windows < 1 or seq_len < len(prefix) + 2:
        raise InputError(f"cannot sample calibration text: {windows} windows of {seq_len} tokens")
    vocab = min(config.vocab_size, llm.tokenizer.get_vocab_size(with_added_tokens=True))
    special = set(llm.tokenizer.get_added_tokens_decoder())
    pool = np.array([i for i in range(vocab) if i not in special])
    if not len(pool):
        raise InputError("cannot sample calibration text: the vocabulary has no plain token")
    starts = np.random.default_rng(seed).choice(pool, windows)
    new = seq_len - len(prefix) - 1
    requests = [
        Request(
            prompt_ids=[*prefix, int(s)],
            params=SamplingParams(
                max_tokens=new, temperature=TEMPERATURE, seed=seed + i, ignore_eos=True
            ),
        )
        for i, s in enumerate(starts)
    ]
    results: dict[str, object] = {}
    made, total = 0, new * windows

    def sink(event) -> None:
        nonlocal made
        made += event.token_id is not None
        if event.result is not None:
            results[event.request_id] = event.result

    scheduler = Scheduler(llm, max_seqs=min(MAX_SEQS, windows))
    sequences = [scheduler.add(r, sink) for r in requests]
    while len(results) < len(sequences):
        scheduler.step()
        if progress:
            progress(made, total)
    out = []
    for seq, start in zip(sequences, starts):
        result = results[seq.request_id]
        if result.error:
            raise InputError(f"cannot sample calibration text: {result.error}")
        out.append([int(start), *result.token_ids])
    return out
