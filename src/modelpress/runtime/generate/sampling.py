"""Choosing the next token from the logits: greedy by default, or sampled.

``SamplingParams`` holds a request's choices and checks every value (``OptionError`` naming the
field in backquotes: the CLI turns them into its flags, the server into a 400 naming the field).

The order is transformers': the repetition penalty on the raw logits (a seen token's logit is
divided by the penalty when positive, multiplied when negative), then the temperature, then
top-k, then top-p (the smallest set of most likely tokens whose probabilities reach ``top_p``;
the most likely token is always kept), then one draw from the renormalized distribution with the
request's own ``numpy.random.Generator`` (``seed`` makes it reproducible).

Without ``temperature``, ``top_k`` or ``top_p`` a request decodes greedily (the arg-max, after the
repetition penalty when one is given); ``temperature=0`` is greedy too.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from modelpress.errors import OptionError

MAX_STOP_STRINGS = 16


@dataclass(frozen=True)
class SamplingParams:
    """How one request generates. ``check()`` raises ``OptionError`` naming a bad field."""

    max_tokens: int = 128
    temperature: float | None = None  # None: greedy unless top_k or top_p is given; 0: greedy
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    eos_token_ids: tuple[int, ...] | None = None  # None: the model's own (its config)
    extra: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        stop = self.stop
        if isinstance(stop, str):
            stop = (stop,)
        object.__setattr__(self, "stop", tuple(stop) if stop is not None else ())
        self.check()

    @property
    def greedy(self) -> bool:
        if self.temperature == 0:
            return True
        return self.temperature is None and self.top_k is None and self.top_p is None

    def check(self) -> None:
        def bad(name: str, rule: str) -> OptionError:
            return OptionError(f"`{name}` {rule}, got {getattr(self, name)!r}")

        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise bad("max_tokens", "must be an integer of at least 1")
        if self.temperature is not None and not (
            _is_real(self.temperature) and 0 <= self.temperature < math.inf
        ):
            raise bad("temperature", "must be a number >= 0")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise bad("top_k", "must be an integer of at least 1")
        if self.top_p is not None and not (_is_real(self.top_p) and 0 < self.top_p <= 1):
            raise bad("top_p", "must be a number in (0, 1]")
        if self.repetition_penalty is not None and not (
            _is_real(self.repetition_penalty) and 0 < self.repetition_penalty < math.inf
        ):
            raise bad("repetition_penalty", "must be a number > 0")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            raise bad("seed", "must be an integer >= 0")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise OptionError(f"`stop`: at most {MAX_STOP_STRINGS} stop strings")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise bad("stop", "must be non-empty strings")
        if self.eos_token_ids is not None and not all(_is_int(t) for t in self.eos_token_ids):
            raise bad("eos_token_ids", "must be integers")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        d["stop"] = list(self.stop)
        return d


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return (
        isinstance(value, (int, float, np.integer, np.floating))
        and not isinstance(value, bool)
        and not math.isnan(value)
    )


def apply_repetition_penalty(logits: np.ndarray, seen, penalty: float) -> np.ndarray:
    """``logits`` (one row) with the tokens in ``seen`` penalized (a copy)."""
    out = np.array(logits, dtype=np.float32, copy=True)
    ids = np.unique(np.asarray(seen, dtype=np.int64))
    ids = ids[(ids >= 0) & (ids < out.shape[-1])]
    picked = out[ids]
    out[ids] = np.where(picked < 0, picked * penalty, picked / penalty)
    return out


def distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens a draw may pick and their probabilities (summing to 1), most likely first:
    temperature, then top-k, then top-p, on one row of (already penalized) logits."""
    x = np.asarray(logits, dtype=np.float64)
    temperature = 1.0 if params.temperature is None else float(params.temperature)
    x = x / temperature
    k = x.shape[-1] if params.top_k is None else min(int(params.top_k), x.shape[-1])
    if k < x.shape[-1]:
        ids = np.argpartition(-x, k - 1)[:k]
    else:
        ids = np.arange(x.shape[-1])
    # most likely first; ties keep the lower token id first (stable sort on the negated logits)
    ids = ids[np.lexsort((ids, -x[ids]))]
    z = x[ids] - x[ids[0]]
    probs = np.exp(z)
    probs /= probs.sum()
    if params.top_p is not None and params.top_p < 1:
        before = np.cumsum(probs) - probs  # the mass of the tokens more likely than each
        keep = int(np.count_nonzero(before < params.top_p))
        ids, probs = ids[: max(keep, 1)], probs[: max(keep, 1)]
        probs = probs / probs.sum()
    return ids, probs


def choose(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator, seen) -> int:
    """The next token of one sequence from its last ``logits`` row; ``seen``: its prompt and
    generated ids, an array or a list (read only for the repetition penalty)."""
    if params.repetition_penalty is not None and params.repetition_penalty != 1:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return int(logits.argmax())
    ids, probs = distribution(logits, params)
    u = rng.random()
    index = int(np.searchsorted(np.cumsum(probs), u, side="right"))
    return int(ids[min(index, len(ids) - 1)])


def new_rng(seed: int | None) -> np.random.Generator:
    """A request's own generator: reproducible with a seed, fresh entropy without."""
    return np.random.default_rng(seed)
