"""Chat messages to a prompt: the model's chat template, rendered the way transformers does.

The template is the Jinja text of ``tokenizer_config.json``'s ``chat_template`` (or of a
``chat_template.jinja`` beside it, where newer checkpoints keep it). It is rendered in Jinja's
immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, loop controls, a ``tojson`` filter
that does not escape HTML, the helpers ``raise_exception``, ``strftime_now``, ``dict`` and
``namespace``, and the variables ``messages``, ``add_generation_prompt``, ``tools``,
``documents`` and the special tokens (``bos_token``, ``eos_token``, ...) as strings: what
``transformers``' ``apply_chat_template`` passes. A template's own error
(``raise_exception("...")``) or a malformed message is an ``InputError`` naming it.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from modelpress.errors import InputError, ModelLoadError, require

SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
ROLES_NEED_CONTENT = ("system", "user")


@functools.cache
def _environment():
    """Jinja's immutable sandbox set up as transformers sets it up (the ``llm`` extra)."""
    require("jinja2", extra="llm", purpose="a chat template")
    import jinja2.ext
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (marks assistant text for training
        masks): rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: dt.datetime.now().strftime(fmt)
    env.globals["dict"] = dict
    env.globals["namespace"] = jinja2.utils.Namespace
    return env


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template and the special tokens it may use."""

    source: str
    special_tokens: dict

    def __post_init__(self) -> None:
        import jinja2

        try:
            compiled = _environment().from_string(self.source)
        except jinja2.TemplateError as exc:
            raise ModelLoadError(f"chat template: {exc}") from None
        object.__setattr__(self, "_compiled", compiled)

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        **variables,
    ) -> str:
        """The prompt text of ``messages`` (``[{"role": ..., "content": ...}, ...]``)."""
        import jinja2

        check_messages(messages)
        try:
            return self._compiled.render(
                messages=messages,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                **{**self.special_tokens, **variables},
            )
        except jinja2.TemplateError as exc:
            raise InputError(f"chat template: {exc}") from None


def check_messages(messages) -> None:
    """``InputError`` naming the first malformed message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise InputError("`messages` must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InputError(f"`messages[{i}]` must be an object with role and content")
        if not isinstance(m.get("role"), str):
            raise InputError(f"`messages[{i}].role` must be a string")
        content = m.get("content")
        if content is None and m["role"] in ROLES_NEED_CONTENT:
            raise InputError(f"`messages[{i}].content` is missing")
        if content is not None and not isinstance(content, (str, list)):
            raise InputError(f"`messages[{i}].content` must be a string or a list of parts")


def read_chat_template(folder: str | Path, tokenizer_config: dict) -> ChatTemplate | None:
    """The chat template of an LLM folder, or None when the checkpoint had none."""
    source = tokenizer_config.get("chat_template")
    jinja_file = Path(folder) / "chat_template.jinja"
    if source is None and jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    if isinstance(source, list):  # several named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str) or not source.strip():
        return None
    special = {
        name: text
        for name in SPECIAL_TOKENS
        if (text := _token_text(tokenizer_config.get(name))) is not None
    }
    return ChatTemplate(source, special)
