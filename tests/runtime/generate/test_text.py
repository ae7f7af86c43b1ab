"""Incremental detokenization (multi-byte characters split across tokens) and stop strings."""

from __future__ import annotations

import pytest
from generate_testing import TEXT, tiny_tokenizer

from modelpress.runtime.generate.text import Detokenizer, StopMatcher


def _metaspace_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "</s>"], show_progress=False
    )
    tok.train_from_iterator([TEXT] * 4, trainer=trainer)
    return tok


@pytest.mark.parametrize("make", [tiny_tokenizer, _metaspace_tokenizer])
def test_pieces_join_to_the_whole_decode_and_never_split_a_character(make):
    tok = make()
    text = "Grüße aus Köln: 東京 🙂🚀 and the lazy dog."
    ids = tok.encode(text).ids
    if make is tiny_tokenizer:  # byte-level: some tokens hold part of a character
        assert any("\ufffd" in tok.decode([i]) for i in ids)
    d = Detokenizer(tok)
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == tok.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_special_tokens_are_left_out_of_the_text():
    tok = tiny_tokenizer()
    ids = tok.encode("the dog").ids + [2] + tok.encode(" ran").ids
    d = Detokenizer(tok)
    assert "".join(d.add(i) for i in ids) + d.flush() == "the dog ran"


def _feed(stops, pieces):
    m = StopMatcher(tuple(stops))
    out = [m.add(p) for p in pieces]
    if m.stopped is None:
        out.append(m.finish())
    return out, m


def test_a_stop_string_split_across_pieces_is_never_emitted():
    out, m = _feed(["STOP"], ["Hello S", "TO", "P world"])
    assert "".join(out) == "Hello " and m.stopped == "STOP"
    assert out[0] == "Hello "  # "S" held back: it may begin the stop string


def test_held_back_text_is_released_when_it_was_not_a_stop():
    out, m = _feed(["STOP"], ["Hello S", "T", "ar"])
    assert m.stopped is None and "".join(out) == "Hello STar"
    assert out[:2] == ["Hello ", ""]


def test_the_earliest_stop_string_wins():
    out, m = _feed(["cd", "b"], ["abcd"])
    assert out == ["a"] and m.stopped == "b"


def test_no_stop_strings_release_everything_at_once():
    out, m = _feed([], ["a", "b"])
    assert out == ["a", "b", ""]
