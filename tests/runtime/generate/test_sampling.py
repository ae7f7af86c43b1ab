"""Sampling against numpy formulas on given logits; every bad value named."""

from __future__ import annotations

import numpy as np
import pytest

from modelpress.errors import OptionError
from modelpress.runtime.generate.sampling import (
    SamplingParams,
    apply_repetition_penalty,
    choose,
    distribution,
    new_rng,
)

LOGITS = np.array([2.0, -1.0, 0.5, 3.0, 0.0, -3.0, 1.0, 2.5], np.float32)


def _softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()


def _reference(logits, *, temperature=1.0, top_k=None, top_p=None):
    """The distribution written out: softmax(x / T), top-k, smallest set reaching top_p."""
    p = _softmax(np.asarray(logits, np.float64) / temperature)
    order = np.argsort(-p, kind="stable")
    if top_k is not None:
        order = order[:top_k]
    q = p[order] / p[order].sum()
    if top_p is not None:
        n = 1
        while q[:n].sum() < top_p:
            n += 1
        order, q = order[:n], q[:n] / q[:n].sum()
    full = np.zeros_like(p)
    full[order] = q
    return full


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, None, None), (0.5, None, None), (2.0, 3, None), (1.0, None, 0.8), (0.7, 5, 0.6)],
)
def test_distribution_equals_the_formula(temperature, top_k, top_p):
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    ids, probs = distribution(LOGITS, params)
    got = np.zeros(len(LOGITS))
    got[ids] = probs
    np.testing.assert_allclose(got, _reference(LOGITS, **params_kw(params)), rtol=1e-12, atol=0)


def params_kw(p):
    return {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p}


def test_draws_follow_the_distribution_and_a_seed_repeats_them():
    params = SamplingParams(temperature=0.8, top_k=4, top_p=0.9, seed=7)
    draws = [choose(LOGITS, params, rng, np.array([], np.int64)) for rng in [new_rng(7)] * 20000]
    again = [choose(LOGITS, params, rng, np.array([], np.int64)) for rng in [new_rng(7)] * 20000]
    assert draws == again
    freq = np.bincount(draws, minlength=len(LOGITS)) / len(draws)
    np.testing.assert_allclose(
        freq, _reference(LOGITS, temperature=0.8, top_k=4, top_p=0.9), atol=0.015
    )


def test_repetition_penalty_is_transformers_formula():
    seen = np.array([0, 1, 1, 5])
    out = apply_repetition_penalty(LOGITS, seen, 1.3)
    want = LOGITS.copy()
    for t in {0, 1, 5}:
        want[t] = LOGITS[t] / 1.3 if LOGITS[t] > 0 else LOGITS[t] * 1.3
    np.testing.assert_array_equal(out, want)
    # greedy with the penalty: token 3 (3.0) stays, token 7 (2.5) beats a penalized token 0
    assert choose(LOGITS, SamplingParams(repetition_penalty=1.3), new_rng(0), np.array([3])) == 7


def test_greedy_is_the_argmax_without_sampling_options():
    assert SamplingParams().greedy and SamplingParams(temperature=0).greedy
    assert not SamplingParams(top_k=2).greedy
    rng = new_rng(0)
    assert {choose(LOGITS, SamplingParams(), rng, np.array([])) for _ in range(5)} == {3}


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": 2.5}, "max_tokens"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_k": 0}, "top_k"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"seed": -1}, "seed"),
        ({"stop": ("",)}, "stop"),
        ({"stop": tuple("abcdefghijklmnopq")}, "stop"),
    ],
)
def test_bad_values_name_their_field(kwargs, field):
    with pytest.raises(OptionError, match=f"`{field}`") as exc:
        SamplingParams(**kwargs)
    assert "\n" not in str(exc.value)
