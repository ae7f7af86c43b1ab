"""The batch of running sequences and one model step over it.

``Engine`` owns the batched ``KVCache`` and the sequences in its rows (row ``i`` of the cache is
``running[i]``). ``prefill(sequences)`` runs each new prompt alone (batch 1, nothing padded, so
a prompt's cache is what a solo run computes; a prompt longer than ``prefill_chunk`` tokens goes
through in chunks), chooses its first token and joins its cache to the batch; ``decode()`` runs
one step for every running row and chooses each row's next token with that row's own sampling.
A sequence that finishes leaves at once (its rows and the columns no row uses any more are
dropped); ``cancel(ids)`` ends sequences from outside.

The batch's cache lives in a ``KVStore`` (``cache.py``): a decoder whose ``writes_present`` is
true (``OrtDecoder``) is handed the store's spare buffers as ``present`` and writes the step's
cache there; any other decoder returns new arrays, which the cache copies in. A decoder that
``shares_kv`` (``OrtDecoder`` of a left-aligned folder) gets share mode instead: the store's
buffers have room for each row's prompt plus ``max_tokens`` (``reserve``), a decode step is
handed them as both past and present and writes only its new entries; the rows are copied only
when they join or leave (or when the room runs out: it doubles).

The engine is synchronous and single-threaded; ``scheduler.py`` decides when to call it.
"""

from __future__ import annotations

import numpy as np

from modelpress.ir.llm import LEFT_ALIGNED, DecoderConfig
from modelpress.runtime.generate.cache import KVCache
from modelpress.runtime.generate.sampling import choose
from modelpress.runtime.generate.sequence import Event, Sequence

PREFILL_CHUNK = 512


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
        self.steps = 0  # decode steps run (for tests and metrics)

    def _empty(self, rows: int = 0, *, stored: bool = False) -> KVCache:
        return KVCache.empty(self.config, rows=rows, stored=stored, shared=stored and self.shared)

    def reset(self) -> list[Sequence]:
        """Drop every running sequence and the cache (after a failure); the dropped ones."""
        running, self.running = self.running, []
        self.cache = self._empty(stored=True)
        return running

    def prefill(self, sequences: list[Sequence]) -> list[Event]:
        """Run each new prompt, choose its first token; the unfinished join the batch."""
        events = []
        for seq in sequences:
            logits, cache = self._prefill(seq.prompt_ids)
            event = seq.add(choose(logits[0], seq.params, seq.rng, seq.seen))
            events.append(event)
            if not seq.finished:
                self.cache.reserve(_need([*self.running, seq]))
                self.cache.join(cache)
                self.running.append(seq)
        return events

    def _prefill(self, token_ids: list[int]) -> tuple[np.ndarray, KVCache]:
        """The last logits and the cache of ``token_ids`` run from an empty cache, alone."""
        cache = self._empty(rows=1)
        prompt = np.asarray([token_ids], dtype=np.int64)
        # a long prompt goes through in chunks: the logits of a whole 8k-token prompt at once
        # would take gigabytes ([tokens, vocab] floats), and only the last row is used; not past
        # a rope switch (``prefill_again_after``): the chunks before it would be rotated apart
        chunk = self.prefill_chunk
        if self.config.prefill_again_after is not None and len(token_ids) > chunk:
            chunk = len(token_ids)
        for start in range(0, prompt.shape[1], chunk):
            ids = prompt[:, start : start + chunk]
            mask, positions = cache.step_inputs(new=ids.shape[1])
            logits, keys, values = self.decoder(ids, mask, positions, cache.keys, cache.values)
            cache.advance(keys, values, mask, new=ids.shape[1])
        return logits, cache

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
            logits, cache = self._prefill(seq.prompt_ids + seq.token_ids)
            events.append(seq.add(choose(logits[0], seq.params, seq.rng, seq.seen)))
            if not seq.finished:
                self.cache.reserve(_need([*self.running, seq]))
                self.cache.join(cache)
                self.running.append(seq)
        return events

    def cancel(self, request_ids, *, reason: str = "cancelled", error: str | None = None):
        """End the running sequences of ``request_ids``; their last events."""
        wanted = set(request_ids)
        rows = [i for i, s in enumerate(self.running) if s.request_id in wanted]
        events = [self.running[i].end(reason, error) for i in rows]
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
