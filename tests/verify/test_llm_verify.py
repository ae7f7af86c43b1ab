"""Perplexity's windows against a direct computation; top-1 agreement of a model with itself."""

import math

import numpy as np
import pytest
from llm_convert_testing import tiny_llm

from modelpress.errors import InputError
from modelpress.verify.llm import (
    Decoder,
    perplexity_of_ids,
    prompts_from_text,
    read_text,
    top1_agreement,
    verify_llm,
)

TEXT = "Once upon a time there was a small model that ran on every CPU. " * 8


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llm")
    tiny_llm(tmp, seed=1, text=TEXT)
    return tmp


def _direct_nll(decoder, ids, first, end, begin):
    """-log p(ids[t] | ids[begin:t]) summed over t in [first, end), one forward per token."""
    total = 0.0
    for t in range(first, end):
        z = decoder.logits(ids[begin:t])[-1].astype(np.float64)
        total -= z[ids[t]] - (z.max() + math.log(np.exp(z - z.max()).sum()))
    return total


def test_perplexity_windows(folder):
    d = Decoder.open(folder / "float")
    ids = d.encode(TEXT)[:40]
    # disjoint windows of 16: each scores its tokens after its first, from its own start
    p = perplexity_of_ids(d, ids, window=16, stride=16)
    nll = _direct_nll(d, ids, 1, 16, 0) + _direct_nll(d, ids, 17, 32, 16)
    nll += _direct_nll(d, ids, 33, 40, 32)
    assert p.tokens == 37
    assert p.nll == pytest.approx(nll / 37, rel=1e-5)
    # overlapping windows: tokens 16..23 are scored by the window starting at 8
    p = perplexity_of_ids(d, ids[:24], window=16, stride=8)
    nll = _direct_nll(d, ids, 1, 16, 0) + _direct_nll(d, ids, 16, 24, 8)
    assert p.tokens == 23 and p.nll == pytest.approx(nll / 23, rel=1e-5)
    assert p.perplexity == pytest.approx(math.exp(p.nll))


def test_agreement_with_itself_and_verify(folder):
    d = Decoder.open(folder / "float")
    a = top1_agreement(d, d, prompts_from_text(d, TEXT, count=3, length=6), steps=5)
    assert a.top1_agreement == 1.0 and a.positions == 15
    r = verify_llm(folder / "float", folder / "float", folder / "text.txt", window=32, stride=16)
    assert r.ratio == pytest.approx(1.0) and r.top1_agreement == 1.0
    assert set(r.to_dict()) >= {"perplexity", "top1_agreement", "ratio"}


def test_bad_text(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_text(tmp_path / "none.txt")
    (tmp_path / "e.txt").write_text("")
    with pytest.raises(InputError, match="empty"):
        read_text(tmp_path / "e.txt")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(InputError, match="UTF-8"):
        read_text(tmp_path / "b.txt")
