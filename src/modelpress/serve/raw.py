"""Raw items in, answers out: the infer call of a model that declares its processing.

A model whose metadata declares pre- and post-processing (``modelpress pipeline``; read by
``runtime.processing.Processing.from_model``) also takes what a user actually has:

- a body that *is* the item: ``Content-Type: image/*``, ``audio/*`` or ``application/octet-stream``
  (bytes) or ``text/plain`` (a text), without ``Inference-Header-Content-Length``; the answer is the
  post-processed JSON of that item;
- a v2 request whose one input is a ``BYTES`` tensor that is not an input of the model (any name,
  e.g. ``raw``): one item per element; the answer is a ``BYTES`` output ``answer`` with one JSON
  document per item, so v2 clients (``tritonclient``) need nothing new.

The items are pre-processed off the event loop, run through the model's batcher like any request
(so raw requests batch with each other when their processed shapes agree), and post-processed off
the loop. The same ``Processing`` object serves ``modelpress run``: one declaration, one code path.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np

from modelpress.errors import InputError
from modelpress.serve.batcher import Batcher
from modelpress.serve.errors import RequestError, logged, model_failure
from modelpress.serve.protocol import InferRequest
from modelpress.serve.repository import ServedModel

RAW_TYPES = ("image/", "audio/", "text/plain", "application/octet-stream")
ANSWER = "answer"


def is_raw(content_type: str | None, header_length: str | None) -> bool:
    """True for a body that is one raw item rather than a v2 request."""
    if header_length is not None or not content_type:
        return False
    kind = content_type.split(";")[0].strip().lower()
    return kind.startswith(RAW_TYPES)


def items_from_body(model: ServedModel, body: bytes, content_type: str | None) -> list[bytes | str]:
    _require(model)
    kind = (content_type or "").split(";")[0].strip().lower()
    if kind == "text/plain":
        try:
            return [body.decode("utf-8")]
        except UnicodeDecodeError:
            raise RequestError(400, "a text/plain body must be UTF-8") from None
    return [body]


def is_raw_request(model: ServedModel, request: InferRequest) -> bool:
    """A v2 request of raw items: one BYTES input that the model itself does not have."""
    if model.processing is None or len(request.inputs) != 1:
        return False
    ((name, arr),) = request.inputs.items()
    return arr.dtype == object and name not in {s.name for s in model.inputs}


def _require(model: ServedModel) -> None:
    if model.processing is None:
        raise RequestError(
            400,
            f"model {model.name!r} declares no pre-processing, so it takes tensors, not raw items "
            "(declare one with `modelpress pipeline`)",
        )


async def infer(model: ServedModel, batcher: Batcher, items: list[bytes | str]) -> list[dict]:
    """One JSON-able answer per raw item."""
    _require(model)
    loop = asyncio.get_running_loop()
    processing = model.processing
    try:
        arrays = await loop.run_in_executor(None, processing.preprocess, items)
    except RequestError:
        raise
    except InputError as exc:  # our own words: an undecodable image, a text too long
        raise RequestError(
            400, f"model {model.name!r} cannot pre-process this item: {_line(exc)}"
        ) from None
    except Exception as exc:  # a library's own words, which may name its internals
        ref = logged(f"model {model.name!r}: pre-processing failed: {_line(exc)}")
        raise RequestError(
            400,
            f"model {model.name!r} cannot pre-process this item: not the kind of item its "
            f"pipeline reads (server log #{ref})",
        ) from None
    feeds, rows, key = model.check(arrays)
    try:
        outputs = await batcher.submit(feeds, rows, key)
    except RequestError:
        raise
    except Exception as exc:
        raise model_failure(model.name, exc, inputs_of=model.inputs_of) from None
    try:
        return await loop.run_in_executor(None, processing.postprocess, outputs)
    except Exception as exc:
        ref = logged(f"model {model.name!r}: post-processing failed: {_line(exc)}")
        raise RequestError(
            500, f"model {model.name!r}: post-processing failed (server log #{ref})"
        ) from None


async def infer_tensor(
    model: ServedModel, batcher: Batcher, request: InferRequest
) -> dict[str, np.ndarray]:
    """The v2 form: a BYTES tensor of items in, a BYTES tensor ``answer`` of JSON documents out."""
    (arr,) = request.inputs.values()
    items = list(arr.reshape(-1))  # bytes: a file's content, or a text in UTF-8
    answers = await infer(model, batcher, items)
    out = np.empty(len(answers), dtype=object)
    out[:] = [json.dumps(a).encode() for a in answers]
    return {ANSWER: out}


def _line(exc: BaseException) -> str:
    return (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
