"""Moving-average min-max observer: the range is an exponential moving average of each batch's
min and max (``r ← r + c · (batch − r)``, the first batch sets it).

Less sensitive to a single outlier batch than min-max; with ``averaging_constant=1`` it keeps only
the last batch.
"""

from __future__ import annotations

import numpy as np

from modelpress.compress.quantize.observers.minmax import MinMaxObserver


class MovingAverageMinMaxObserver(MinMaxObserver):
    name = "moving-average"
    supports_per_channel = True

    def __init__(self, *, averaging_constant: float = 0.01, **kwargs):
        super().__init__(**kwargs)
        if not 0 < averaging_constant <= 1:
            raise ValueError("averaging_constant must be in (0, 1]")
        self.c = averaging_constant

    def _update(self, lo: np.ndarray, hi: np.ndarray) -> None:
        if self.lo is None:
            self.lo, self.hi = lo.astype(np.float64), hi.astype(np.float64)
        else:
            self.lo = self.lo + self.c * (lo - self.lo)
            self.hi = self.hi + self.c * (hi - self.hi)
