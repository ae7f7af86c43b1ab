"""Text pre-processing with MiniLM's real tokenizer.json, against the tokenizers library's own
batch encoding with the same truncation and padding."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from pipeline_testing import text_model, tokenizer_path
from tokenizers import Tokenizer

from modelpress.errors import InputError, OptionError
from modelpress.runtime.processing import Processing

TEXTS = [
    "The cat sat on the mat.",
    "ONNX Runtime runs the optimized graph on the CPU, and graph rewrites must never change results.",
    "héllo wörld — ünïcode",
    "",
]


def library_encoding(texts, *, max_length, length=None):
    tok = Tokenizer.from_file(str(tokenizer_path()))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]", length=length)
    enc = tok.encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in enc], np.int64),
        "attention_mask": np.array([e.attention_mask for e in enc], np.int64),
        "token_type_ids": np.array([e.type_ids for e in enc], np.int64),
    }


def test_longest_padding_equals_the_library_and_the_model_runs(tmp_path):
    model, emb, typ = text_model()
    proc = Processing.declare(model, pre=f"text:tokenizer={tokenizer_path()},max_length=16")
    assert (proc.pre.padding, proc.pre.ids, proc.pre.mask, proc.pre.types) == (
        "longest",
        "input_ids",
        "attention_mask",
        "token_type_ids",
    )
    feeds = proc.preprocess(TEXTS)
    want = library_encoding(TEXTS, max_length=16)
    assert feeds.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(feeds[k], want[k])
        assert feeds[k].dtype == np.int64
    assert feeds["input_ids"].shape == (4, 16)  # the long text is truncated to 16
    # the model itself: masked mean of the two embeddings, in numpy
    from modelpress.runtime.session import Session

    got = Session(model, device="cpu").run(feeds)["embedding"]
    h = emb[want["input_ids"]] + typ[want["token_type_ids"]]
    m = want["attention_mask"][:, :, None]
    np.testing.assert_allclose(got, (h * m).sum(1) / m.sum(1), rtol=1e-5, atol=1e-6)


def test_fixed_sequence_forces_max_length_and_tokenizer_travels_with_the_model(tmp_path):
    tok = tmp_path / "tokenizer.json"
    shutil.copy(tokenizer_path(), tok)
    model, _, _ = text_model(seq=12)
    proc = Processing.declare(model, pre=f"text:tokenizer={tok}")
    assert (proc.pre.padding, proc.pre.max_length) == ("max_length", 12)
    proc.store(model)
    tok.unlink()  # the model needs nothing beside it
    again = Processing.from_model(model)
    feeds = again.preprocess([t.encode() for t in TEXTS[:2]])  # UTF-8 bytes work as well
    want = library_encoding(TEXTS[:2], max_length=12, length=12)
    for k in want:
        np.testing.assert_array_equal(feeds[k], want[k])
    with pytest.raises(
        OptionError, match=r"^pre\.max_length: 20 given, the model takes sequences of exactly 12"
    ):
        Processing.declare(model, pre=f"text:tokenizer={tokenizer_path()},max_length=20")
    with pytest.raises(OptionError, match=r"^pre\.padding: "):
        Processing.declare(model, pre=f"text:tokenizer={tokenizer_path()},padding=longest")


def test_no_truncation_refuses_a_long_text_naming_it():
    model, _, _ = text_model()
    proc = Processing.declare(
        model, pre=f"text:tokenizer={tokenizer_path()},max_length=10,truncation=false"
    )
    with pytest.raises(InputError, match=r"^item 1: \d+ tokens, the model takes at most 10"):
        proc.preprocess(TEXTS[:2])
    with pytest.raises(InputError, match=r"^item 0: text is not valid UTF-8"):
        proc.preprocess([b"\xff\xfe"])


def test_bad_text_declarations_name_the_field(tmp_path):
    model, _, _ = text_model()
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": "nope"}')
    cases = [
        ("text:max_length=8", "pre.tokenizer"),  # no tokenizer
        (f"text:tokenizer={tmp_path / 'missing.json'}", "pre.tokenizer"),
        (f"text:tokenizer={bad}", "pre.tokenizer"),
        (f"text:tokenizer={tokenizer_path()},ids=tokens", "pre.ids"),
        (f"text:tokenizer={tokenizer_path()},max_length=0", "pre.max_length"),
        (f"text:tokenizer={tokenizer_path()},lowercase=true", "pre.lowercase"),
    ]
    for pre, field in cases:
        with pytest.raises(OptionError) as info:
            Processing.declare(model, pre=pre)
        assert str(info.value).startswith(f"{field}:"), (pre, str(info.value))
    # a model input the text does not feed
    from pipeline_testing import image_model

    with pytest.raises(OptionError, match=r"^pre\.(ids|input)"):
        Processing.declare(image_model(), pre=f"text:tokenizer={tokenizer_path()}")
