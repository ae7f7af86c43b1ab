"""Moving-average min-max observer: the range is an exponential moving average of each batch's
min and max (``r ← r + c · (batch − r)``, the first batch sets it).

Less sensitive to a single outlier batch than min-max; with ``averaging_constant=1`` it keeps only
the last batch.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.base import Observer


class MovingAverageMinMaxObserver(Observer):
    name = "moving-average"
    supports_per_channel = True

    def __init__(self, *, averaging_constant: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        if not 0 < averaging_constant <= 1:
            raise ValueError("averaging_constant must be in (0, 1]")
        self.c = averaging_constant
        self.lo: np.ndarray | None = None
        self.hi: np.ndarray | None = None

    def observe(self, x: np.ndarray) -> None:
        if np.size(x) == 0:
            return
        lo, hi = self._channel_minmax(x)
        if self.lo is None:
            self.lo, self.hi = lo.astype(np.float64), hi.astype(np.float64)
        else:
            self.lo = self.lo + self.c * (lo - self.lo)
            self.hi = self.hi + self.c * (hi - self.hi)
        self.count += int(np.size(x))

    def _range(self):
        return self.lo, self.hi
