"""Calibration observers, looked up by name: ``observe(x)`` records statistics of activations,
``qparams()`` turns them into a scale and zero point.

The CLI's ``--method`` choices come from ``OBSERVERS``; ``kl`` is an alias of ``entropy``.
"""

from __future__ import annotations

from modelpress.compress.quantize.observers.base import Observer, StreamingHistogram
from modelpress.compress.quantize.observers.entropy import EntropyObserver
from modelpress.compress.quantize.observers.minmax import MinMaxObserver
from modelpress.compress.quantize.observers.moving_average import MovingAverageMinMaxObserver
from modelpress.compress.quantize.observers.mse import MSEObserver
from modelpress.compress.quantize.observers.percentile import PercentileObserver
from modelpress.errors import OptionError

OBSERVERS: dict[str, type[Observer]] = {
    cls.name: cls
    for cls in (
        MinMaxObserver,
        MovingAverageMinMaxObserver,
        PercentileObserver,
        EntropyObserver,
        MSEObserver,
    )
}
ALIASES = {"kl": "entropy", "max": "minmax", "moving_average": "moving-average"}


def get_observer(name: str) -> type[Observer]:
    key = ALIASES.get(name, name)
    if key not in OBSERVERS:
        raise OptionError(
            f"`method` {name}: unknown calibration method; choose one of {', '.join(OBSERVERS)}"
        )
    return OBSERVERS[key]


__all__ = ["ALIASES", "OBSERVERS", "Observer", "StreamingHistogram", "get_observer"]
