"""``advise --qps --p99-ms --check``: the service plan with the server's measured cost, and the
measured check of this machine's option (what ``deploy`` does, without writing a folder)."""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx_ir as ir

from modelpress.advisor.service import ServicePlan
from modelpress.deploy.check import PlanCheck, check_option
from modelpress.deploy.overhead import ServerCost, calibrate
from modelpress.deploy.plan import plan, queue_size, sample_request
from modelpress.ir import save


@dataclass
class CheckedPlan:
    plan: ServicePlan
    cost: ServerCost
    check: PlanCheck | None  # None: this machine is not among the options

    def to_dict(self) -> dict:
        return {
            "service": self.plan.to_dict(),
            "server_cost": self.cost.to_dict(),
            "check": self.check.to_dict() if self.check else None,
        }


def checked_plan(
    model: ir.Model,
    *,
    name: str,
    qps: float,
    p99_ms: float,
    cost: ServerCost | None = None,
    plan_options: Mapping[str, Any] | None = None,
    check_requests: int = 2000,
    check_seconds: float = 10.0,
) -> CheckedPlan:
    """Plan ``model`` with the server's own cost (calibrated here unless ``cost``), then serve it
    as this machine's option plans and measure it open-loop at its rate. ``plan_options``: the
    other keyword arguments of ``plan`` (``gpus``, ``cpu``, ``precision``, ``max_batch``, ...)."""
    cost = cost or calibrate()
    sample = sample_request(model, name)
    service = plan(
        model, name=name, qps=qps, p99_ms=p99_ms, cost=cost, sample=sample, **(plan_options or {})
    )
    option = next((o for o in service.options if o.kind == "cpu"), None)
    measured = None
    if option is not None:
        with tempfile.TemporaryDirectory(prefix="modelpress-check-") as tmp:
            path = save(model, Path(tmp) / "model.onnx")
            measured = check_option(
                option,
                model_path=str(path),
                name=name,
                body=sample.body,
                qps=qps,
                max_queue=queue_size(option, qps=qps, p99_ms=p99_ms),
                max_requests=check_requests,
                max_seconds=check_seconds,
            )
    return CheckedPlan(service, cost, measured)


__all__ = ["CheckedPlan", "checked_plan"]
