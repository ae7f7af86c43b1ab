"""The batch of running sequences and one model step over it.

``Engine`` owns the batched ``KVCache`` and the sequences in its rows (row ``i`` of the cache is
``running[i]``). ``admit(sequences)`` queues new prompts; ``prefill()`` runs them, each alone
(batch 1, nothing padded, so a prompt's cache is what a solo run computes), in chunks of
``prefill_chunk`` tokens from the prompt's start, at most ``prefill_chunk`` tokens a call while
other sequences run (more chunks only while the batch is empty): a long prompt then holds the
running rows up for one chunk between their decode steps, not for its whole length. A prompt
whose last chunk ran chooses its first token and joins its cache to the batch. The chunks' bounds
do not depend on what else runs, so neither does a prompt's cache. ``decode()`` runs one step
for every running row and chooses each row's next token with that row's own sampling. A
sequence that finishes leaves at once (its rows and the columns no row uses any more are
dropped); ``cancel(ids)`` ends sequences from outside, prefilling ones included.

The batch's cache lives in a ``KVStore`` (``cache.py``): a decoder whose ``writes_present`` is
true (``OrtDecoder``) is handed the store's spare buffers as ``present`` and writes the step's
cache there; any other decoder returns new arrays, which the cache copies in. A decoder that
``shares_kv`` (``OrtDecoder`` of a left-aligned folder) gets share mode instead: the store's
buffers have room for each row's prompt plus ``max_tokens`` (``reserve``; at most twice the
rows' columns for ``in_place``, whose steps read every column: ``kv_store``), a decode step is
handed them as both past and present and writes only its new entries; the rows are copied only
when they join or leave (or when the room runs out: it doubles).

The engine is synchronous and single-threaded; ``scheduler.py`` decides when to call it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from modelpress.ir.llm import LEFT_ALIGNED, DecoderConfig
from modelpress.runtime.generate.cache import KVCache
from modelpress.runtime.generate.sampling import choose
from modelpress.runtime.generate.sequence import Event, Sequence

PREFILL_CHUNK = 256  # tokens of a prompt a step: the longest a prefill holds running rows up


@dataclass
class _Prefill:
    """A prompt being prefilled: its sequence, the tokens to run and its cache so far."""

    seq: Sequence
    ids: list[int]
    cache: KVCache
    done: int = 0  # tokens run
    logits: np.ndarray | None = None


class Engine:
    def __init__(self, decoder, config: DecoderConfig, *, prefill_chunk: int = PREFILL_CHUNK):
        self.decoder = decoder
        self.config = config
        self.prefill_chunk = prefill_chunk
        # share mode (``cache.py``): a left-aligned decoder that binds past and present to
        # the same buffers (``OrtDecoder.shares_kv``)
        self.shared = bool(getattr(decoder, "shares_kv", False)) and (
            config.kv_layout in LEFT_ALIGNED
        )
        self.cache = self._empty(stored=True)
        self.running: list[Sequence] = []
        self.prefilling: list[_Prefill] = []  # admitted, oldest first
        self.steps = 0  # decode steps run (for tests and metrics)

    def _empty(self, rows: int = 0, *, stored: bool = False) -> KVCache:
        return KVCache.empty(self.config, rows=rows, stored=stored, shared=stored and self.shared)

    @property
    def active(self) -> int:
        """Sequences holding a slot: running or being prefilled."""
        return len(self.running) + len(self.prefilling)

    def reset(self) -> list[Sequence]:
        """Drop every sequence and the cache (after a failure); the dropped ones."""
        dropped = [p.seq for p in self.prefilling] + self.running
        self.running, self.prefilling = [], []
        self.cache = self._empty(stored=True)
        return dropped

    def admit(self, sequences: list[Sequence]) -> None:
        """Queue new prompts for ``prefill``."""
        self.prefilling += [_Prefill(s, list(s.prompt_ids), self._empty(rows=1)) for s in sequences]

    def prefill(self) -> list[Event]:
        """Run the admitted prompts' next chunks (module docstring); a prompt run to its end
        chooses its first token and, unfinished, joins the batch."""
        events: list[Event] = []
        budget = self.prefill_chunk if self.running else None
        while self.prefilling and (budget is None or budget > 0):
            p = self.prefilling[0]
            ran = self._chunk(p)
            if budget is not None:
                budget -= ran
            if p.done < len(p.ids):
                continue
            self.prefilling.pop(0)
            seq = p.seq
            events.append(seq.add(choose(p.logits[0], seq.params, seq.rng, seq.seen)))
            if not seq.finished:
                self.cache.reserve(_need([*self.running, seq]))
                self.cache.join(p.cache)
                self.running.append(seq)
        return events

    def _chunk(self, p: _Prefill) -> int:
        """Run ``p``'s next chunk; the tokens it ran. Chunks start at multiples of
        ``prefill_chunk`` (the logits of a whole 8k-token prompt at once would take gigabytes,
        [tokens, vocab] floats, and only the last row is used); a sequence that will cross a
        rope switch (``prefill_again_after``) runs whole: chunks before it would be rotated
        apart."""
        chunk = self.prefill_chunk
        if self.config.prefill_again_after is not None and len(p.ids) > chunk:
            chunk = len(p.ids)
        ids = np.asarray([p.ids[p.done : p.done + chunk]], dtype=np.int64)
        mask, positions = p.cache.step_inputs(new=ids.shape[1])
        p.logits, keys, values = self.decoder(ids, mask, positions, p.cache.keys, p.cache.values)
        p.cache.advance(keys, values, mask, new=ids.shape[1])
        p.done += ids.shape[1]
        return ids.shape[1]

    def decode(self) -> list[Event]:
        """One step for every running sequence."""
        events = self._prefill_again()
        if not self.running:
            return events
        groups = self._groups()
        steps = []
        for rows in groups:
            cache = self.cache if len(groups) == 1 else self.cache.take(rows)
            ids = np.asarray([[self.running[i].token_ids[-1]] for i in rows], dtype=np.int64)
            mask, positions = cache.step_inputs(new=1)
            logits, keys, values = self._step(ids, mask, positions, cache)
            cache.advance(keys, values, mask, new=1)
            # a share-mode decoder's logits are its output buffer, rewritten by the next step
            steps.append((logits.copy() if len(groups) > 1 else logits, cache))
        if len(groups) > 1:  # back together, the rows in the groups' order
            self.running = [self.running[i] for i in np.concatenate(groups)]
            merged = steps[0][1]
            for _, cache in steps[1:]:
                merged.join(cache)
            self.cache.assign(merged)
        if len(steps) > 1:
            logits = np.concatenate([logits for logits, _ in steps], axis=0)
        self.steps += 1
        events += [
            seq.add(choose(logits[i], seq.params, seq.rng, seq.seen))
            for i, seq in enumerate(self.running)
        ]
        self._retire([i for i, s in enumerate(self.running) if s.finished])
        return events

    def _step(self, ids, mask, positions, cache: KVCache):
        if not getattr(self.decoder, "writes_present", False):
            return self.decoder(ids, mask, positions, cache.keys, cache.values)
        shared = cache.in_place(new=ids.shape[1])
        if shared is not None:  # past and present: the same buffers, written in place
            return self.decoder(ids, mask, positions, *shared, present=shared)
        present = cache.spare(new=ids.shape[1])
        if present is None:
            return self.decoder(ids, mask, positions, cache.keys, cache.values)
        return self.decoder(ids, mask, positions, cache.keys, cache.values, present=present)

    def _groups(self) -> list:
        """The rows that may share a step: all of them, except around ``prefill_again_after``:
        the graph takes the rope switch on the batch's largest position, so rows on either side
        of it must run apart."""
        limit = self.config.prefill_again_after
        if limit is None:
            return [range(len(self.running))]
        rows = np.arange(len(self.running))
        below = self.cache.lengths < limit
        if below.all() or not below.any():
            return [rows]
        return [rows[below], rows[~below]]

    def _prefill_again(self) -> list[Event]:
        """Rows whose next token crosses ``prefill_again_after`` (Phi-3's rope switch) run their
        whole sequence again, alone, instead of this step; they rejoin at the batch's end."""
        limit = self.config.prefill_again_after
        if limit is None or not self.running:
            return []
        rows = [int(i) for i in np.flatnonzero(self.cache.lengths == limit)]
        if not rows:
            return []
        seqs = [self.running[i] for i in rows]
        self._retire(rows)
        events = []
        for seq in seqs:
            p = _Prefill(seq, seq.prompt_ids + seq.token_ids, self._empty(rows=1))
            while p.done < len(p.ids):
                self._chunk(p)
            events.append(seq.add(choose(p.logits[0], seq.params, seq.rng, seq.seen)))
            if not seq.finished:
                self.cache.reserve(_need([*self.running, seq]))
                self.cache.join(p.cache)
                self.running.append(seq)
        return events

    def cancel(self, request_ids, *, reason: str = "cancelled", error: str | None = None):
        """End the sequences of ``request_ids``, running or being prefilled; their last events."""
        wanted = set(request_ids)
        events = [p.seq.end(reason, error) for p in self.prefilling if p.seq.request_id in wanted]
        self.prefilling = [p for p in self.prefilling if p.seq.request_id not in wanted]
        rows = [i for i, s in enumerate(self.running) if s.request_id in wanted]
        events += [self.running[i].end(reason, error) for i in rows]
        self._retire(rows)
        return events

    def _retire(self, rows: list[int]) -> None:
        if rows:
            gone = set(rows)
            self.running = [s for i, s in enumerate(self.running) if i not in gone]
            self.cache.reserve(_need(self.running))
            self.cache.leave(rows)


def _need(sequences: list[Sequence]) -> int:
    """The cache columns ``sequences`` may come to hold: the longest prompt plus tokens to come."""
    return max((len(s.prompt_ids) + s.params.max_tokens for s in sequences), default=0)
