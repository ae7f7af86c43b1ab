"""Hardware advisor: which accelerator runs a workload, how fast, at what cost.

``catalog`` (devices with a source for every number), ``clocks`` (what a power-limited card
sustains), ``estimate`` (roofline time, memory fit, batch search), ``cost`` (cloud and owned),
``recommend`` (ranked devices per scenario), ``service`` (how many replicas of each device serve
a request rate at a p99 latency, with ``batching``: the batches dynamic batching forms and the
latency they give, ``curve``/``measured``: service time per batch, estimated or measured here),
``calibrate`` (this CPU, measured against the prediction) and ``published`` (the published
measurements the efficiency factors are fitted on and checked against).
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
from modelpress.advisor.service import NoServiceError, ServiceOption, ServicePlan, plan_service

__all__ = [
    "DEFAULT_EFFICIENCY",
    "GPU",
    "Catalog",
    "Cost",
    "Efficiency",
    "Estimate",
    "NoServiceError",
    "NoViableDeviceError",
    "Pricing",
    "Recommendation",
    "Request",
    "ServiceOption",
    "ServicePlan",
    "best_under_latency",
    "cost_of",
    "estimate",
    "load_catalog",
    "max_batch",
    "plan_service",
    "recommend",
    "time_to_train",
]
