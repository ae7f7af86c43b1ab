"""``deploy()``: from a model and a traffic target to a folder that serves it, and a measured check.

1. Search (``search.auto``) for the fastest version within the accuracy budget, when ``data``
   is given; otherwise the model is deployed as given. With labels, the search holds out half the
   samples (seeded, stratified by class: ``search.split``) to score every candidate and trains
   the candidates that train (structured pruning with fine-tuning, QAT, distillation into a
   narrower student) on the other half only.
2. Protect it (an ``.mpk`` package) when a key is given.
3. Plan the service (``plan.plan``): the model's service curve measured on this CPU and, for
   ``gpus``, estimated; the server's own cost per request measured against the real server
   (``overhead.calibrate``). The option ranked first is deployed.
4. Write the folder (``bundle``): the model, its recipe, ``serve.yaml``, Ray Serve's config, a
   KServe manifest, a Triton repository and a Dockerfile, each read back by its tool.
5. Check the plan (``check.check_option``): when this machine is one of the options, serve the
   model with its settings and drive it open-loop at its rate; measured p99 and throughput
   beside the promise.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from modelpress.advisor.catalog import load_catalog
from modelpress.advisor.service import ServiceOption, ServicePlan
from modelpress.deploy.bundle import staged, write_bundle
from modelpress.deploy.check import PlanCheck, check_option
from modelpress.deploy.overhead import ServerCost, calibrate
from modelpress.deploy.plan import fewest_replicas, plan, queue_size, sample_request
from modelpress.deploy.settings import ServeSettings
from modelpress.deploy.validate import Check
from modelpress.errors import OptionError
from modelpress.ir import load
from modelpress.ir.feeds import as_model, load_npz
from modelpress.protect import load_key, protect
from modelpress.search import AutoResult, Recipe, auto
from modelpress.serve.repository import model_name


@dataclass
class DeployResult:
    folder: str
    name: str
    model_file: str
    search: AutoResult | None
    cost: ServerCost
    plan: ServicePlan
    chosen: ServiceOption
    settings: ServeSettings
    checks: list[Check]
    check: PlanCheck | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "folder": self.folder,
            "name": self.name,
            "model_file": self.model_file,
            "qps": self.plan.qps,
            "p99_ms": self.plan.p99_ms,
            "chosen": self.chosen.to_dict(),
            "settings": self.settings.to_dict(),
            "server_cost": self.cost.to_dict(),
            "service": self.plan.to_dict(),
            "files": [c.to_dict() for c in self.checks],
            "check": self.check.to_dict() if self.check else None,
            "search": self.search.to_dict() if self.search else None,
            "notes": list(self.notes),
        }


def deploy(
    model: str | os.PathLike,
    output: str | os.PathLike,
    *,
    qps: float,
    p99_ms: float,
    data: str | os.PathLike | None = None,
    labels_key: str | None = None,
    max_accuracy_drop: float = 0.01,
    time_budget_s: float = 600.0,
    key_file: str | os.PathLike | None = None,
    key_env: str | None = None,
    gpus: list[str] | None = None,
    device: str = "cpu",
    name: str | None = None,
    train: bool = True,
    check: bool = True,
    check_requests: int = 2000,
    check_seconds: float = 10.0,
    cost: ServerCost | None = None,
    image: str | None = None,
    progress: Callable | None = None,
    catalog_files: list[str] | None = None,
) -> DeployResult:
    """Search, protect, plan, write and check (see the module docstring)."""
    out = Path(output)
    name = model_name(model, name)
    if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        raise OptionError(f"`device` {device!r}: cpu or cuda")
    if qps is None or qps <= 0:
        raise OptionError(f"`qps` {qps}: give the requests per second to serve, above 0")
    if p99_ms is None or p99_ms <= 0:
        raise OptionError(f"`p99_ms` {p99_ms}: give the p99 latency target in ms, above 0")
    catalog = load_catalog(catalog_files)
    found = [catalog.lookup(g) for g in dict.fromkeys(gpus or [])]  # a bad name fails here
    if device.startswith("cuda") and not found:
        raise OptionError("`device` cuda: name the GPU the plan is for (`gpus`)")
    key = load_key(key_file, key_env) if (key_file or key_env) else None
    notes: list[str] = []

    # 1. search
    result = None
    if data is not None:
        cache = out.with_name(out.name + ".auto")
        result = auto(
            model,
            data=data,
            train=train,
            labels_key=labels_key,
            max_accuracy_drop=max_accuracy_drop,
            time_budget_s=time_budget_s,
            cache_dir=cache,
            target="cpu" if not device.startswith("cuda") else found[0].gpu.name,
            progress=progress,
        )
        if result.model is None:
            raise OptionError("the search built no candidate; see `modelpress auto` for why")
        if labels_key and train and result.split is None:
            notes.append(f"{data}: too few samples to train on part of them; post-training only")
        chosen_model: ir.Model = result.model
        recipe = result.recipe
        if not result.met:
            notes.append(f"the search missed the accuracy budget by {result.shortfall:.4g}")
    else:
        chosen_model = load(model) if str(model).endswith(".onnx") else as_model(model)
        recipe = Recipe(
            steps=[], model=str(model), notes=["deployed as given (no data to search with)"]
        )
        notes.append("no data: the model is deployed as given, not searched")
    if recipe is not None and key is not None:
        recipe.notes = [*recipe.notes, "then protected (modelpress protect) with the deploy key"]

    # 2-3. plan, with the server's own cost
    cost = cost or calibrate()
    feeds = load_npz(data) if data is not None else None
    sample = sample_request(chosen_model, name, feeds)
    on_cpu = not device.startswith("cuda")
    service = plan(
        chosen_model,
        name=name,
        qps=qps,
        p99_ms=p99_ms,
        cost=cost,
        sample=sample,
        gpus=[f.gpu for f in found],
        cpu=on_cpu or not found,
        gpu_notes={f.gpu.name: f.note for f in found if f.note},
    )
    chosen = service.options[0]
    settings = ServeSettings(
        model="model.mpk" if key is not None else "model.onnx",
        name=name,
        max_batch=chosen.max_batch,
        max_delay_ms=round(chosen.max_delay_ms, 3),
        max_queue=queue_size(chosen, qps=qps, p99_ms=p99_ms),
        replicas=chosen.replicas,
        device="cuda" if chosen.kind == "gpu" else "cpu",
        protected=key is not None,
        plan={
            "qps": qps,
            "p99_ms": p99_ms,
            "device": chosen.device,
            "promised_p99_ms": round(chosen.queue.p99_ms, 3),
            "mean_ms": round(chosen.queue.mean_ms, 3),
            "mean_batch": round(chosen.queue.mean_batch, 3),
            "fewest_replicas": fewest_replicas(chosen, qps),
            "server_ms_per_request": round(cost.seconds(sample.bytes) * 1e3, 3),
        },
    )

    # 4. the folder
    def package(path: Path) -> None:
        protect(chosen_model, key=key, output=path)

    with staged(out) as folder:
        checks = write_bundle(
            folder,
            model=chosen_model,
            settings=settings,
            final=out,
            recipe=recipe,
            package=package if key is not None else None,
            image=image,
        )
    if key is not None:
        notes.append("protected: Triton's repository is left out (Triton cannot open a package)")

    # 5. the check, on this machine's option
    measured = None
    cpu_option = next((o for o in service.options if o.kind == "cpu"), None)
    if check and cpu_option is not None:
        measured = check_option(
            cpu_option,
            model_path=str(out / settings.model),
            name=name,
            body=sample.body,
            qps=qps,
            max_queue=queue_size(cpu_option, qps=qps, p99_ms=p99_ms),
            key_file=str(key_file) if key_file else None,
            key_env=key_env if not key_file else None,
            max_requests=check_requests,
            max_seconds=check_seconds,
        )
        if cpu_option is not chosen:
            notes.append(
                f"checked this machine's option; the deployed one ({chosen.device}) is not here to measure"
            )
    elif check:
        notes.append("not checked: this machine is not one of the options")
    return DeployResult(
        folder=str(out),
        name=name,
        model_file=settings.model,
        search=result,
        cost=cost,
        plan=service,
        chosen=chosen,
        settings=settings,
        checks=checks,
        check=measured,
        notes=notes,
    )


__all__ = ["DeployResult", "deploy"]
