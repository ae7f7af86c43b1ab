"""``Processing``: what turns raw items into a model's inputs and its outputs into answers,
declared once and stored in the model (``metadata_props["modelpress.processing"]``, JSON), so the
batch job (``run``), the server (``serve``) and the Python API apply exactly the same steps.

    proc = Processing.declare(model, pre="image:resize=256,crop=224", post="softmax,topk=5")
    proc.store(model)                       # then save the model
    proc = Processing.from_model(model)     # None when the model declares nothing
    feeds = proc.preprocess([png_bytes, jpeg_bytes])
    answers = proc.postprocess(session.run(feeds))

A declaration is checked against the model when it is made and again when it is read back (the
file may have been edited since): every input must be fed, sizes, channels, dtypes and label
counts must agree. A mismatch raises ``OptionError`` naming the field (``pre.mean``,
``post.labels``). The stored form is complete (defaults resolved, label and tokenizer files
inlined), so the model needs nothing beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelLoadError, OptionError, require
from modelpress.runtime.processing import audio, image, signature, text
from modelpress.runtime.processing.audio import AudioPre
from modelpress.runtime.processing.fields import check_keys, fail, split_items
from modelpress.runtime.processing.image import ImagePre
from modelpress.runtime.processing.post import KEYS as POST_KEYS
from modelpress.runtime.processing.post import Post
from modelpress.runtime.processing.text import TextPre

METADATA_KEY = "modelpress.processing"
VERSION = 1
PRE_KINDS: dict[str, type] = {"image": ImagePre, "text": TextPre, "audio": AudioPre}
Pre = ImagePre | TextPre | AudioPre


@dataclass(frozen=True)
class Processing:
    pre: Pre | None
    post: Post | None

    # -- making and storing --------------------------------------------------------------------
    @classmethod
    def declare(
        cls,
        model: ir.Model,
        *,
        pre: str | dict | None = None,
        post: str | dict | None = None,
        base: str | Path | None = None,
    ) -> Processing:
        """A declaration checked against ``model``: ``pre`` as ``"image:resize=256,..."`` or a
        dict with ``kind``; ``post`` as ``"softmax,topk=5"`` or a dict. Relative file names
        (labels, tokenizer) are read from ``base`` (the spec file's folder; the current one)."""
        if pre is None and post is None:
            raise OptionError(
                "declare pre-processing (`pre`), post-processing (`post`) or both (`spec`)"
            )
        base = Path(base) if base is not None else None
        inputs, outputs = signature.inputs(model), signature.outputs(model)
        p = None
        if pre is not None:
            kind, raw = parse_pre(pre)
            p = PRE_KINDS[kind].declare(raw, inputs, base=base)
            fed = set(p.input_names)
            unfed = [t.name for t in inputs if t.name not in fed]
            if unfed:
                raise fail(
                    "pre.input",
                    f"the model's input {unfed[0]!r} is not fed by {kind} pre-processing",
                )
        q = Post.declare(parse_post(post), outputs, base=base) if post is not None else None
        return cls(p, q)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"version": VERSION}
        if self.pre is not None:
            d["pre"] = self.pre.to_dict()
        if self.post is not None:
            d["post"] = self.post.to_dict()
        return d

    def store(self, model: ir.Model) -> None:
        """Write the declaration into ``model``'s metadata (replacing one already there)."""
        model.metadata_props[METADATA_KEY] = json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_model(cls, model: ir.Model) -> Processing | None:
        """The processing ``model`` declares, checked against it; None when it declares none."""
        text = model.metadata_props.get(METADATA_KEY)
        if text is None:
            return None
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ModelLoadError(
                f"the model's {METADATA_KEY} metadata is not valid JSON ({exc})"
            ) from None
        if data.get("version") != VERSION:
            raise ModelLoadError(
                f"the model's {METADATA_KEY} metadata has version {data.get('version')!r}; "
                f"this modelpress reads version {VERSION}"
            )
        try:
            return cls.declare(model, pre=data.get("pre"), post=data.get("post"))
        except OptionError as exc:
            raise ModelLoadError(
                f"the processing stored in the model does not fit it: {exc}"
            ) from None

    # -- running -------------------------------------------------------------------------------
    def prepare(self, item: Any, *, label: str = "item") -> dict[str, np.ndarray]:
        """One item as the model's inputs without the batch axis (what a worker process makes)."""
        return self._pre().prepare(item, label=label)

    def collate(self, prepared: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Prepared items as one batch of feeds (stacked; token ids padded)."""
        return self._pre().collate(prepared)

    def preprocess(self, items: list[bytes | str]) -> dict[str, np.ndarray]:
        """One batch of feeds for ``items``: bytes of an image or audio file, text as str or
        UTF-8 bytes. An item that cannot be used raises InputError naming it (``item 3: ...``)."""
        return self.collate([self.prepare(item, label=f"item {i}") for i, item in enumerate(items)])

    def postprocess(self, outputs: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """One JSON-able answer per item (row along axis 0) of a batch's ``outputs``."""
        if self.post is not None:
            return self.post.answers(outputs[self.post.output])
        rows = {name: np.asarray(v) for name, v in outputs.items()}
        n = next(iter(rows.values())).shape[0] if rows else 0
        return [
            {name: v[i].tolist() for name, v in rows.items() if v.ndim and v.shape[0] == n}
            for i in range(n)
        ]

    def _pre(self) -> Pre:
        if self.pre is None:
            raise OptionError(
                "the model declares no pre-processing; give it model inputs instead of raw items"
            )
        return self.pre

    def describe(self) -> list[str]:
        """One line per stage, for people."""
        lines = []
        for stage, part in (("pre", self.pre), ("post", self.post)):
            if part is None:
                continue
            d = part.to_dict()
            if "tokenizer_json" in d:
                d["tokenizer_json"] = f"<{len(d['tokenizer_json'])} chars>"
            if "labels" in d:
                d["labels"] = f"<{len(d['labels'])} labels>"
            kind = d.pop("kind", None)
            items = ", ".join(f"{k}={_show(v)}" for k, v in d.items())
            lines.append(f"{stage}: {kind + ': ' if kind else ''}{items}")
        return lines


def _show(v: Any) -> str:
    if isinstance(v, list):
        return (
            "x".join(map(str, v))
            if all(isinstance(x, int) for x in v)
            else ",".join(f"{x:g}" if isinstance(x, float) else str(x) for x in v)
        )
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def parse_pre(pre: str | dict) -> tuple[str, dict[str, Any]]:
    """``"image:resize=256,crop=224"`` or ``{"kind": "image", ...}`` into (kind, raw fields)."""
    if isinstance(pre, str):
        kind, sep, rest = pre.partition(":")
        kind = kind.strip().lower()
        if kind not in PRE_KINDS:
            raise fail(
                "pre",
                f"starts with the kind: {', '.join(k + ':' for k in PRE_KINDS)} (got {pre[:40]!r})",
            )
        keys = {"image": image.KEYS, "text": text.KEYS, "audio": audio.KEYS}[kind]
        return kind, split_items(rest, set(keys), where="pre")
    if not isinstance(pre, dict):
        raise fail("pre", f"expected a string or a mapping, got {type(pre).__name__}")
    raw = dict(pre)
    kind = str(raw.pop("kind", "")).lower()
    if kind not in PRE_KINDS:
        raise fail("pre.kind", f"one of {', '.join(PRE_KINDS)} (got {kind or 'nothing'!r})")
    return kind, raw


def parse_post(post: str | dict) -> dict[str, Any]:
    if isinstance(post, str):
        return split_items(post, set(POST_KEYS), where="post")
    if not isinstance(post, dict):
        raise fail("post", f"expected a string or a mapping, got {type(post).__name__}")
    return dict(post)


def read_spec(path: str | Path) -> dict[str, Any]:
    """A declaration file: JSON, or YAML (``.yaml``/``.yml``), with ``pre`` and/or ``post``."""
    p = Path(path)
    if not p.is_file():
        raise OptionError(f"`spec` {p}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"`spec` {p}: cannot be read ({type(exc).__name__})") from None
    try:
        if p.suffix.lower() in (".yaml", ".yml"):
            yaml = require("yaml", extra="pipeline", purpose="a YAML declaration")
            data = yaml.safe_load(text)
        else:
            data = json.loads(text)
    except Exception as exc:  # noqa: BLE001 - both parsers raise their own error classes
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        raise OptionError(
            f"`spec` {p}: not valid {'YAML' if p.suffix.lower() in ('.yaml', '.yml') else 'JSON'} ({first})"
        ) from None
    if not isinstance(data, dict):
        raise OptionError(f"`spec` {p}: expected a mapping with pre and/or post")
    check_keys(data, {"pre", "post"}, where="spec")
    out: dict[str, Any] = {}
    if data.get("pre") is not None:
        kind, raw = parse_pre(data["pre"])
        out["pre"] = {"kind": kind, **_resolved(raw, ("tokenizer",), p.parent)}
    if data.get("post") is not None:
        out["post"] = _resolved(parse_post(data["post"]), ("labels",), p.parent)
    return out


def _resolved(raw: dict[str, Any], keys: tuple[str, ...], base: Path) -> dict[str, Any]:
    """``raw`` with the file names under ``keys`` made relative to ``base`` (a spec's folder)."""
    return {k: str(base / v) if k in keys and isinstance(v, str) else v for k, v in raw.items()}
