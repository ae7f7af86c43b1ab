"""Judge an LLM folder by its predictions: perplexity on a text, greedy agreement with another.

The decoder runs under ONNX Runtime directly, one full window at a time with an empty KV cache
(``past`` of length 0): scoring needs no cache.

- ``perplexity``: the text is tokenized whole (the folder's ``tokenizer.json``, no special
  tokens) and scored in windows of ``window`` tokens that start every ``stride`` tokens (the
  Hugging Face recipe): a window scores only its tokens that no earlier window scored, each
  predicted from up to ``window - 1`` tokens before it; the first window scores all its tokens
  but the first. Perplexity is ``exp`` of the mean negative log-likelihood over the scored tokens.
  With ``stride == window`` the windows are disjoint (faster, less context per token) and each
  window's first token goes unscored (nothing before it in the window).
- ``top1_agreement``: for each prompt, the reference's greedy continuation of ``steps`` tokens;
  then both models score prompt + continuation in one pass, and the agreement is the fraction of
  continuation positions (the prompt's last token included) where their argmax is the same.
  The candidate is thus judged on the reference's path, never on its own drift.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from modelpress.errors import InputError, ModelLoadError, OptionError, renamed
from modelpress.ir import llm
from modelpress.runtime import ort as ort_backend


@dataclass
class Decoder:
    """An LLM folder's decoder, tokenizer and config, ready to score token ids."""

    folder: Path
    config: llm.DecoderConfig
    session: object
    tokenizer: object
    input_names: set = field(default_factory=set)

    @classmethod
    def open(
        cls, folder: str | os.PathLike, *, threads: int | None = None, optimize: str = "all"
    ) -> Decoder:
        """The folder's decoder under ONNX Runtime with its ``optimize`` level (``all``: as it
        is deployed; note that at ``all`` ONNX Runtime fuses a blockwise ``DequantizeLinear`` +
        ``MatMul`` into ``MatMulNBits`` with int8 activations, ``accuracy_level`` 4)."""
        from tokenizers import Tokenizer

        config = llm.read_config(folder)
        p = Path(folder)
        try:
            tokenizer = Tokenizer.from_file(str(p / llm.TOKENIZER_FILE))
        except Exception as exc:  # the tokenizers package raises plain Exceptions
            raise ModelLoadError(f"{p / llm.TOKENIZER_FILE}: not a tokenizer ({exc})") from None
        so = ort_backend.session_options(optimize=optimize, intra_op_threads=threads)
        session = ort_backend.session(p / llm.MODEL_FILE, options=so)
        names = {i.name for i in session.get_inputs()}
        return cls(p, config, session, tokenizer, names)

    def encode(self, text: str) -> np.ndarray:
        return np.array(self.tokenizer.encode(text, add_special_tokens=False).ids, np.int64)

    def feeds(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """Prefill feeds for ``ids [batch, seq]``: full mask, positions from 0, empty cache."""
        ids = np.atleast_2d(np.asarray(ids, np.int64))
        b, t = ids.shape
        c = self.config
        feeds = {
            llm.INPUT_IDS: ids,
            llm.ATTENTION_MASK: np.ones((b, t), np.int64),
            llm.POSITION_IDS: np.broadcast_to(np.arange(t, dtype=np.int64), (b, t)).copy(),
        }
        empty = llm.past_feed(
            c.kv_layout, np.zeros((b, c.num_kv_heads, 0, c.head_dim), np.dtype(c.kv_dtype)), t
        )
        for i in range(c.num_layers):
            for name in llm.past_names(i):
                feeds[name] = empty
        return {k: v for k, v in feeds.items() if k in self.input_names}

    def logits(self, ids: np.ndarray) -> np.ndarray:
        """``[seq, vocab]`` float32 logits of one sequence."""
        (out,) = self.session.run([llm.LOGITS], self.feeds(np.asarray(ids)[None]))
        return out[0].astype(np.float32)

    def greedy(self, prompt: np.ndarray, steps: int) -> np.ndarray:
        ids = np.asarray(prompt, np.int64)
        for _ in range(steps):
            ids = np.append(ids, np.int64(np.argmax(self.logits(ids)[-1])))
        return ids


def read_text(path: str | os.PathLike) -> str:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not a UTF-8 text file ({str(exc).splitlines()[0]})") from None
    if not text.strip():
        raise InputError(f"{p}: the text file is empty")
    return text


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    nll: float  # mean negative log-likelihood per scored token (nats)
    tokens: int  # tokens scored
    window: int
    stride: int
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def _log_softmax_at(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    m = z.max(axis=-1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(z - m).sum(axis=-1))).astype(np.float64)
    return z[np.arange(len(targets)), targets] - lse


def perplexity_of_ids(
    decoder: Decoder, ids: np.ndarray, *, window: int = 512, stride: int = 256
) -> Perplexity:
    """Perplexity of ``decoder`` on the token ids (module docstring for the windows)."""
    if window < 2 or stride < 1 or stride > window:
        raise OptionError(f"`window` ({window}) must be ≥ 2 and `stride` ({stride}) in 1..window")
    window = min(window, decoder.config.max_context)
    stride = min(stride, window)
    if len(ids) < 2:
        raise InputError("the text has fewer than 2 tokens: nothing to score")
    start_time = time.perf_counter()
    total, count, scored_to = 0.0, 0, 1  # positions < scored_to have been scored (0 never is)
    for begin in range(0, len(ids) - 1, stride):
        end = min(begin + window, len(ids))
        if end <= scored_to:
            continue
        logits = decoder.logits(ids[begin:end])
        first = max(scored_to, begin + 1)  # the first position this window scores
        targets = ids[first:end]
        lp = _log_softmax_at(logits[first - 1 - begin : end - 1 - begin], targets)
        total -= float(lp.sum())
        count += len(targets)
        scored_to = end
        if end == len(ids):
            break
    nll = total / count
    return Perplexity(math.exp(nll), nll, count, window, stride, time.perf_counter() - start_time)


def perplexity(
    folder: str | os.PathLike,
    text: str | os.PathLike,
    *,
    window: int = 512,
    stride: int = 256,
    max_tokens: int | None = None,
    threads: int | None = None,
) -> Perplexity:
    """Perplexity of the LLM folder on the text file ``text`` (its first ``max_tokens`` tokens)."""
    decoder = Decoder.open(folder, threads=threads)
    ids = decoder.encode(read_text(text))
    if max_tokens:
        ids = ids[:max_tokens]
    return perplexity_of_ids(decoder, ids, window=window, stride=stride)


def prompts_from_text(
    decoder: Decoder, text: str, *, count: int = 8, length: int = 32
) -> list[np.ndarray]:
    """``count`` prompts of ``length`` tokens taken at even intervals through the text."""
    ids = decoder.encode(text)
    if len(ids) < length + 1:
        return [ids] if len(ids) else []
    starts = np.linspace(0, len(ids) - length, num=count).astype(int)
    return [ids[s : s + length] for s in sorted(set(starts.tolist()))]


@dataclass(frozen=True)
class Agreement:
    top1_agreement: float
    positions: int
    prompts: int
    steps: int
    per_prompt: list[float]

    def to_dict(self) -> dict:
        return asdict(self)


def greedy_paths(reference: Decoder, prompts: list[np.ndarray], steps: int) -> list[tuple]:
    """``(prompt, path, the reference's argmax along it)`` per prompt, to judge several
    candidates against one reference without decoding it again."""
    out = []
    for prompt in prompts:
        path = reference.greedy(prompt, steps)
        span = slice(len(prompt) - 1, len(path) - 1)
        out.append((prompt, path, np.argmax(reference.logits(path)[span], axis=-1)))
    return out


def top1_agreement(
    reference: Decoder,
    candidate: Decoder,
    prompts: list[np.ndarray],
    *,
    steps: int = 32,
    paths: list[tuple] | None = None,
) -> Agreement:
    """Greedy next-token agreement of ``candidate`` with ``reference`` (module docstring);
    ``paths`` from ``greedy_paths`` saves decoding the reference again."""
    if not prompts:
        raise InputError("no prompts to compare on")
    agree, total, per = 0, 0, []
    for prompt, path, a in paths or greedy_paths(reference, prompts, steps):
        span = slice(len(prompt) - 1, len(path) - 1)
        b = np.argmax(candidate.logits(path)[span], axis=-1)
        same = int((a == b).sum())
        agree, total = agree + same, total + len(a)
        per.append(same / len(a))
    return Agreement(agree / total, total, len(prompts), steps, per)


@dataclass(frozen=True)
class LLMVerifyResult:
    """Two LLM folders compared on one text: perplexity of each, their ratio, top-1 agreement."""

    reference: str
    candidate: str
    text: str
    perplexity: dict  # {"reference": ..., "candidate": ...}
    ratio: float  # candidate / reference
    top1_agreement: float
    details: dict

    def to_dict(self) -> dict:
        return asdict(self)


def verify_llm(
    reference: str | os.PathLike,
    candidate: str | os.PathLike,
    text: str | os.PathLike,
    *,
    window: int = 512,
    stride: int = 256,
    text_tokens: int | None = None,
    prompts: int = 8,
    greedy_tokens: int | None = None,
    threads: int | None = None,
    max_tokens: int | None = None,
    steps: int | None = None,
) -> LLMVerifyResult:
    """Perplexity of both folders on ``text`` (its first ``text_tokens`` tokens, or all of it),
    their ratio, and greedy top-1 agreement over ``prompts`` prompts taken from the same text,
    ``greedy_tokens`` (32) tokens each. ``max_tokens`` and ``steps`` are the old names of
    ``text_tokens`` and ``greedy_tokens``."""
    max_tokens = renamed(text_tokens, max_tokens, new="text_tokens", old="max_tokens")
    steps = renamed(greedy_tokens, steps, new="greedy_tokens", old="steps") or 32
    body = read_text(text)
    ref = Decoder.open(reference, threads=threads)
    cand = Decoder.open(candidate, threads=threads)
    ids = ref.encode(body)
    if max_tokens:
        ids = ids[:max_tokens]
    cand_ids = cand.encode(body)[: len(ids)]
    if not np.array_equal(ids, cand_ids):
        raise InputError(
            f"{reference} and {candidate} tokenize the text differently: not the same model family"
        )
    p_ref = perplexity_of_ids(ref, ids, window=window, stride=stride)
    p_cand = perplexity_of_ids(cand, ids, window=window, stride=stride)
    agreement = top1_agreement(ref, cand, prompts_from_text(ref, body, count=prompts), steps=steps)
    return LLMVerifyResult(
        str(reference),
        str(candidate),
        str(text),
        {"reference": p_ref.perplexity, "candidate": p_cand.perplexity},
        p_cand.perplexity / p_ref.perplexity,
        agreement.top1_agreement,
        {
            "reference": p_ref.to_dict(),
            "candidate": p_cand.to_dict(),
            "agreement": agreement.to_dict(),
        },
    )
