"""What a request can get wrong, as an HTTP status and one line for the client.

A ``RequestError`` never leaves the server: the app turns it into ``{"error": message}`` with its
status (the Open Inference Protocol's error body), and the request's batch-mates and the server go
on. ``Overloaded`` is the 503 of a full queue, with the seconds a client should wait.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request the server refuses, with the HTTP status that says why."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


class Overloaded(RequestError):
    """The model's queue is full: 503 with ``Retry-After``."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(503, message)
        self.retry_after_s = retry_after_s


def model_failure(model: str, exc: BaseException) -> RequestError:
    """The error a request gets when the model raised on it. ONNX Runtime classifies its own
    errors: INVALID_ARGUMENT (say, an index out of range in this request's data) is the client's
    400; anything else is the server's 500."""
    if isinstance(exc, RequestError):
        return exc
    text = (str(exc).strip() or type(exc).__name__).splitlines()[0][:500]
    status = 400 if type(exc).__name__ == "InvalidArgument" else 500
    return RequestError(status, f"model {model!r} failed on this request: {text}")
