"""Min-max observer: the clip range is the smallest and largest value seen.

Exact and outlier-sensitive: one large activation stretches the scale for every other value.
Supports per-channel ranges (for weights, or activations quantized per channel).
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.base import Observer


class MinMaxObserver(Observer):
    name = "minmax"
    supports_per_channel = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None

    def observe(self, x: np.ndarray) -> None:
        if np.size(x) == 0:
            return
        self._update(*self._channel_minmax(x))
        self.count += int(np.size(x))

    def _update(self, lo: np.ndarray, hi: np.ndarray) -> None:
        """Fold one batch's range (per channel where asked) into the running one."""
        self.lo = lo if self.lo is None else np.minimum(self.lo, lo)
        self.hi = hi if self.hi is None else np.maximum(self.hi, hi)

    def _range(self):
        return self.lo, self.hi
