"""The chat template renders as transformers' ``apply_chat_template`` on the same files."""

from __future__ import annotations

import pytest
from generate_testing import CHATML, tiny_tokenizer, write_tokenizer_files

from modelpress.errors import InputError
from modelpress.runtime.generate.chat import read_chat_template

# a template with the features real ones use: namespace, loop controls, tojson, bos/eos,
# raise_exception, generation blocks
RICH = (
    "{{ bos_token }}{% set ns = namespace(n=0) %}"
    "{% for m in messages %}{% if m['role'] == 'tool' %}{% continue %}{% endif %}"
    "{% if m['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}"
    "{% set ns.n = ns.n + 1 %}<{{ m['role'] }}>{% if m['role'] == 'assistant' %}"
    "{% generation %}{{ m['content'] | trim }}{% endgeneration %}{% else %}"
    "{{ m['content'] }}{% endif %}{{ eos_token }}\n{% endfor %}"
    "{% if tools %}{{ tools | tojson }}{% endif %}"
    "{% if add_generation_prompt %}<assistant>{{ ns.n }}{% endif %}"
)
CHATS = [
    [{"role": "user", "content": "Hi there, ünïcödé 🙂"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "  4  "},
        {"role": "tool", "content": "ignored"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


@pytest.mark.parametrize("template", [CHATML, RICH])
@pytest.mark.parametrize("chat", CHATS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_renders_like_transformers(tmp_path, template, chat, add_generation_prompt):
    from transformers import PreTrainedTokenizerFast

    write_tokenizer_files(tmp_path, tiny_tokenizer(), template=template)
    reference = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    import json

    ours = read_chat_template(
        tmp_path, json.loads((tmp_path / "tokenizer_config.json").read_text())
    )
    want = reference.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.render(chat, add_generation_prompt=add_generation_prompt) == want


def test_raise_exception_and_bad_messages_are_one_line_input_errors():
    t = read_chat_template(".", {"chat_template": RICH, "bos_token": "<s>", "eos_token": "</s>"})
    with pytest.raises(InputError, match="unknown role robot"):
        t.render([{"role": "robot", "content": "x"}])
    with pytest.raises(InputError, match=r"`messages\[0\]\.content` is missing"):
        t.render([{"role": "user"}])
    with pytest.raises(InputError, match="`messages`"):
        t.render([])


def test_special_tokens_as_added_token_dicts_and_no_template():
    t = read_chat_template(
        ".", {"chat_template": "{{ bos_token }}", "bos_token": {"content": "<s>"}}
    )
    assert t.render([{"role": "user", "content": "x"}]) == "<s>"
    assert read_chat_template(".", {}) is None
