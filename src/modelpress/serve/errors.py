"""What a request can get wrong, as an HTTP status and one line for the client.

A ``RequestError`` never leaves the server: the app turns it into ``{"error": message}`` with its
status (the Open Inference Protocol's error body), and the request's batch-mates and the server go
on. ``Overloaded`` is the 503 of a full queue, with the seconds a client should wait.

What a client reads is what it can act on: the input's name and what the model expects. What the
runtime said (op types, node names, table sizes, source paths) goes to the server's log under a
reference number that the client's message repeats, never to the client.
"""

from __future__ import annotations

import itertools
import json
import logging
import re
from collections.abc import Callable

log = logging.getLogger("modelpress.serve")
_REFERENCES = itertools.count(1)


class RequestError(Exception):
    """A request the server refuses, with the HTTP status that says why."""

    def __init__(self, status: int, message: str, *, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class Overloaded(RequestError):
    """The model's queue (or the server's request memory) is full: 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


def json_object(raw: bytes, what: str, *, error: type[RequestError] = RequestError) -> dict:
    """The JSON object in ``raw``, or ``error`` (400) saying what is wrong with ``what``."""
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise error(400, f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(400, f"{what} is nested too deeply") from None
    if not isinstance(doc, dict):
        raise error(400, f"{what} must be a JSON object")
    return doc


def logged(detail: str) -> int:
    """Log ``detail`` under a new reference number, and return the number."""
    ref = next(_REFERENCES)
    log.warning("request #%d: %s", ref, detail)
    return ref


_NODE = re.compile(r"running (\w+) node\. Name:'([^']*)'")


def model_failure(
    model: str, exc: BaseException, *, inputs_of: Callable[[str, str], list[str]] | None = None
) -> RequestError:
    """The error a request gets when the model raised on it. ONNX Runtime classifies its own
    errors: INVALID_ARGUMENT (say, an index out of range in this request's data) is the client's
    400; anything else is the server's 500. ``inputs_of(op_type, node_name)`` names the model
    inputs that feed the failing node, when the runtime's message names one."""
    if isinstance(exc, RequestError):
        return exc
    text = str(exc).strip() or type(exc).__name__
    ref = logged(f"model {model!r} failed: {text}")
    if type(exc).__name__ != "InvalidArgument":
        return RequestError(500, f"model {model!r} failed on this request (server log #{ref})")
    found = _NODE.search(text)
    names = inputs_of(found.group(1), found.group(2)) if found and inputs_of else []
    where = f"input {', '.join(repr(n) for n in names)}" if names else "its inputs"
    return RequestError(
        400,
        f"model {model!r} cannot run on the values of {where}: a value is outside what the model "
        f"accepts, such as an index past the end of a table (server log #{ref})",
    )
