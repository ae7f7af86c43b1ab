"""Generated tokens to text, piece by piece: incremental decoding and stop strings.

A token may hold part of a character (byte-level BPE splits multi-byte UTF-8 across tokens) and a
SentencePiece tokenizer drops the leading space of the first token it decodes, so the text of new
tokens is never decoded on its own. ``Detokenizer`` keeps two offsets into the ids: it decodes a
window that starts a few tokens back (``prefix``) with and without the new tokens and emits the
difference, and holds it back while it ends in U+FFFD (an incomplete character).

``StopMatcher`` holds back the end of the text that could be the start of a stop string, so that
no part of a stop string is ever emitted; when the text contains one it cuts the text there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REPLACEMENT = "\ufffd"


@dataclass
class Detokenizer:
    """Incremental decoding of one sequence's generated ids (``tokenizer``: a ``tokenizers.Tokenizer``)."""

    tokenizer: object
    skip_special_tokens: bool = True
    ids: list[int] = field(default_factory=list)
    prefix: int = 0  # start of the window decoded for context
    read: int = 0  # ids up to here have been emitted as text

    def add(self, token_id: int) -> str:
        """The new text that ``token_id`` completes ('' while a character is still incomplete)."""
        self.ids.append(int(token_id))
        decode = self.tokenizer.decode
        before = decode(
            self.ids[self.prefix : self.read], skip_special_tokens=self.skip_special_tokens
        )
        after = decode(self.ids[self.prefix :], skip_special_tokens=self.skip_special_tokens)
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            new = after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            return new
        return ""

    def flush(self) -> str:
        """What is left at the end (an incomplete character decodes as U+FFFD)."""
        if self.read == len(self.ids):
            return ""
        decode = self.tokenizer.decode
        before = decode(
            self.ids[self.prefix : self.read], skip_special_tokens=self.skip_special_tokens
        )
        after = decode(self.ids[self.prefix :], skip_special_tokens=self.skip_special_tokens)
        self.prefix, self.read = self.read, len(self.ids)
        return after[len(before) :]


@dataclass
class StopMatcher:
    """The text of one sequence, released only when it cannot be part of a stop string."""

    stops: tuple[str, ...] = ()
    text: str = ""  # all the text so far (up to the stop string once one is found)
    emitted: int = 0  # characters of ``text`` already released
    stopped: str | None = None  # the stop string found

    def add(self, piece: str) -> str:
        """Add ``piece``; return the text now safe to release."""
        if self.stopped is not None:
            return ""
        start = max(0, len(self.text) - max((len(s) for s in self.stops), default=0) + 1)
        self.text += piece
        found = [(i, s) for s in self.stops if (i := self.text.find(s, start)) >= 0]
        if found:
            index, self.stopped = min(found)
            self.text = self.text[:index]
            return self._release(len(self.text))
        return self._release(len(self.text) - self._held())

    def finish(self) -> str:
        """Release what was held back (the sequence ended without a stop string)."""
        return self._release(len(self.text))

    def _held(self) -> int:
        """Characters at the end of the text that begin some stop string."""
        held = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.text)), held, -1):
                if self.text.endswith(s[:n]):
                    held = n
                    break
        return held

    def _release(self, upto: int) -> str:
        upto = max(upto, self.emitted)
        out = self.text[self.emitted : upto]
        self.emitted = upto
        return out
