"""Hardware advisor: which accelerator runs a workload, how fast, at what cost.

``catalog`` (devices with a source for every number), ``estimate`` (roofline time, memory fit,
batch search), ``cost`` (cloud and owned), ``recommend`` (ranked devices per scenario),
``calibrate`` (this CPU, measured against the prediction) and ``published`` (the published
measurements the efficiency factors are fitted on).
"""

from modelpress.advisor.catalog import GPU, Catalog, load_catalog
from modelpress.advisor.cost import Cost, Pricing, cost_of
from modelpress.advisor.efficiency import DEFAULT_EFFICIENCY, Efficiency
from modelpress.advisor.estimate import (
    Estimate,
    best_under_latency,
    estimate,
    max_batch,
    time_to_train,
)
from modelpress.advisor.recommend import NoViableDeviceError, Recommendation, Request, recommend

__all__ = [
    "DEFAULT_EFFICIENCY",
    "GPU",
    "Catalog",
    "Cost",
    "Efficiency",
    "Estimate",
    "NoViableDeviceError",
    "Pricing",
    "Recommendation",
    "Request",
    "best_under_latency",
    "cost_of",
    "estimate",
    "load_catalog",
    "max_batch",
    "recommend",
    "time_to_train",
]
