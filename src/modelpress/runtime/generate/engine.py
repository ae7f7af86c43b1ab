"""The batch of running sequences and one model step over it.

``Engine`` owns the batched ``KVCache`` and the sequences in its rows (row ``i`` of the cache is
``running[i]``). ``prefill(sequences)`` runs each new prompt alone (batch 1, nothing padded, so
a prompt's cache is what a solo run computes), chooses its first token and joins its cache to
the batch; ``decode()`` runs one step for every running row and chooses each row's next token
with that row's own sampling. A sequence that finishes leaves at once (its rows and the columns
no row uses any more are dropped); ``cancel(ids)`` ends sequences from outside.

The engine is synchronous and single-threaded; ``scheduler.py`` decides when to call it.
"""

from __future__ import annotations

import numpy as np

from modelpress.ir.llm import DecoderConfig
from modelpress.runtime.generate.cache import KVCache
from modelpress.runtime.generate.sampling import choose
from modelpress.runtime.generate.sequence import Event, Sequence


class Engine:
    def __init__(self, decoder, config: DecoderConfig) -> None:
        self.decoder = decoder
        self.config = config
        self.cache = self._empty()
        self.running: list[Sequence] = []
        self.steps = 0  # decode steps run (for tests and metrics)

    def _empty(self, rows: int = 0) -> KVCache:
        c = self.config
        return KVCache.empty(
            layers=c.num_layers,
            kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            dtype=c.kv_dtype,
            layout=c.kv_layout,
            rows=rows,
        )

    def prefill(self, sequences: list[Sequence]) -> list[Event]:
        """Run each new prompt, choose its first token; the unfinished join the batch."""
        events = []
        for seq in sequences:
            cache = self._empty(rows=1)
            ids = np.asarray([seq.prompt_ids], dtype=np.int64)
            mask, positions = cache.step_inputs(new=ids.shape[1])
            logits, keys, values = self.decoder(ids, mask, positions, cache.keys, cache.values)
            cache.advance(keys, values, mask, new=ids.shape[1])
            event = seq.add(choose(logits[0], seq.params, seq.rng, seq.seen))
            events.append(event)
            if not seq.finished:
                self.cache.join(cache)
                self.running.append(seq)
        return events

    def decode(self) -> list[Event]:
        """One step for every running sequence."""
        if not self.running:
            return []
        ids = np.asarray([[s.token_ids[-1]] for s in self.running], dtype=np.int64)
        mask, positions = self.cache.step_inputs(new=1)
        logits, keys, values = self.decoder(
            ids, mask, positions, self.cache.keys, self.cache.values
        )
        self.cache.advance(keys, values, mask, new=1)
        self.steps += 1
        events = [
            seq.add(choose(logits[i], seq.params, seq.rng, seq.seen))
            for i, seq in enumerate(self.running)
        ]
        self._retire([i for i, s in enumerate(self.running) if s.finished])
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
            self.cache.leave(rows)
            gone = set(rows)
            self.running = [s for i, s in enumerate(self.running) if i not in gone]
