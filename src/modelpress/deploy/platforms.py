"""The files that platforms read to run a deploy folder, made from its ``serve.yaml`` settings.

| file | read by | what the plan sets |
| --- | --- | --- |
| ``ray-serve.yaml`` | ``serve run ray-serve.yaml`` (Ray's CLI) | autoscaling bounds, the target in-flight requests per replica, the batcher |
| ``kserve.yaml`` | ``kubectl apply -f`` (a KServe ``InferenceService``) | min/max replicas, the concurrency each replica is scaled at |
| ``triton/NAME/config.pbtxt`` | Triton Inference Server (``--model-repository triton``) | dynamic batching (max batch, queue delay, queue size), instance group |
| ``Dockerfile`` | ``docker build`` | an image that runs ``modelpress serve`` on the folder |

Autoscaling bounds: the plan's replicas carry the target rate at the p99 target; the fewest that
carry it without saturating (a replica's peak throughput) is the floor a lighter load may scale
down to, and twice the plan the ceiling for bursts above the target. The in-flight requests a
replica holds at the target rate (Little's law: rate × mean latency) is what autoscalers that count
requests (Ray Serve's ``target_ongoing_requests``, Knative's concurrency) aim at.
"""

from __future__ import annotations

import math
import re

import onnx_ir as ir

from modelpress.deploy.settings import ServeSettings
from modelpress.serve.repository import ServedModel

RAY_FILE = "ray-serve.yaml"
KSERVE_FILE = "kserve.yaml"
DOCKER_FILE = "Dockerfile"
TRITON_DIR = "triton"
RAY_IMPORT_PATH = "modelpress.deploy.ray_app:build"
PORT = 8080
KEY_ENV = "MODELPRESS_KEY"


def bounds(settings: ServeSettings) -> dict:
    """Autoscaling bounds from the plan (see the module docstring)."""
    plan = settings.plan or {}
    planned = settings.replicas
    fewest = int(plan.get("fewest_replicas") or 1)
    per_replica = float(plan.get("qps", 0)) / planned if plan.get("qps") else 0.0
    in_flight = per_replica * float(plan.get("mean_ms", 0)) / 1e3
    return {
        "min_replicas": max(1, min(fewest, planned)),
        "initial_replicas": planned,
        "max_replicas": 2 * planned,
        "target_ongoing": max(1, math.ceil(in_flight)),
    }


def dns_name(name: str) -> str:
    """A Kubernetes object name (RFC 1123 label) for a model name."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (out or "model")[:63].rstrip("-")


def ray_config(settings: ServeSettings, folder: str) -> dict:
    """Ray Serve's config file (``ServeDeploySchema``): one application whose builder reads
    ``folder`` (an absolute path: ``serve run`` resolves nothing against the file's place)."""
    b = bounds(settings)
    return {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "applications": [
            {
                "name": "modelpress",
                "route_prefix": "/",
                "import_path": RAY_IMPORT_PATH,
                "args": {"folder": folder},
                "deployments": [
                    {
                        "name": "models",
                        "max_ongoing_requests": settings.max_queue + settings.max_batch,
                        "autoscaling_config": {
                            "min_replicas": b["min_replicas"],
                            "initial_replicas": b["initial_replicas"],
                            "max_replicas": b["max_replicas"],
                            "target_ongoing_requests": b["target_ongoing"],
                        },
                        "ray_actor_options": {
                            "num_cpus": 1,
                            **({"num_gpus": 1} if settings.device.startswith("cuda") else {}),
                        },
                    }
                ],
            }
        ],
    }


def kserve_manifest(settings: ServeSettings, *, image: str) -> dict:
    """A KServe ``InferenceService`` running ``image`` (the folder's Dockerfile) as its predictor."""
    b = bounds(settings)
    container: dict = {
        "name": "kserve-container",
        "image": image,
        "ports": [{"containerPort": PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": PORT}},
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            **({"limits": {"nvidia.com/gpu": "1"}} if settings.device.startswith("cuda") else {}),
        },
    }
    if settings.protected:
        container["env"] = [
            {
                "name": KEY_ENV,
                "valueFrom": {
                    "secretKeyRef": {"name": f"{dns_name(settings.name)}-key", "key": "key"}
                },
            }
        ]
    return {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": dns_name(settings.name),
            "labels": {"app.kubernetes.io/name": "modelpress"},
        },
        "spec": {
            "predictor": {
                "minReplicas": b["min_replicas"],
                "maxReplicas": b["max_replicas"],
                "scaleMetric": "concurrency",
                "scaleTarget": b["target_ongoing"],
                "containers": [container],
            }
        },
    }


def _pb_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def triton_config(settings: ServeSettings, model: ir.Model) -> str:
    """Triton's ``config.pbtxt`` (protobuf text format of ``inference.ModelConfig``) for the
    ONNX Runtime backend, with the plan's batching: ``max_batch_size`` the plan's cap,
    ``max_queue_delay_microseconds`` its delay, the queue bounded like the folder's server, one
    instance per device (the plan's replicas are devices: KServe's or Ray's replicas)."""
    config = ServedModel(settings.name, model, None).config(max_batch=settings.max_batch)
    batched = config["max_batch_size"] > 0

    def tensor(t: dict) -> str:
        dims = ", ".join(str(d) for d in t["dims"])
        return f"  {{ name: {_pb_string(t['name'])} data_type: {t['data_type']} dims: [ {dims} ] }}"

    lines = [
        f"name: {_pb_string(settings.name)}",
        'backend: "onnxruntime"',
        f"max_batch_size: {config['max_batch_size']}",
        "input [",
        ",\n".join(tensor(t) for t in config["input"]),
        "]",
        "output [",
        ",\n".join(tensor(t) for t in config["output"]),
        "]",
    ]
    if batched:
        lines += [
            "dynamic_batching {",
            f"  max_queue_delay_microseconds: {round(settings.max_delay_ms * 1000)}",
            f"  default_queue_policy {{ max_queue_size: {settings.max_queue} }}",
            "}",
        ]
    kind = "KIND_GPU" if settings.device.startswith("cuda") else "KIND_CPU"
    lines += [f"instance_group [ {{ count: {settings.workers} kind: {kind} }} ]", ""]
    return "\n".join(lines)


def dockerfile(settings: ServeSettings) -> str:
    """An image that serves the folder with ``modelpress serve`` on port 8080."""
    serve = ["modelpress", "serve", "/deploy", "--host", "0.0.0.0", "--port", str(PORT)]
    if settings.protected:
        serve += ["--key-env", KEY_ENV]
    cmd = ", ".join(f'"{a}"' for a in serve)
    return "\n".join(
        [
            "# Serves this folder: docker build -t IMAGE . && docker run -p 8080:8080 IMAGE",
            "# (--build-arg MODELPRESS=/path/to/modelpress.whl[serve,protect,pipeline] for a wheel)",
            "FROM python:3.12-slim",
            'ARG MODELPRESS="modelpress[serve,protect,pipeline,search]"',
            'RUN pip install --no-cache-dir "$MODELPRESS"',
            "COPY . /deploy",
            f"EXPOSE {PORT}",
            'HEALTHCHECK CMD python -c "import urllib.request as u; '
            f"u.urlopen('http://127.0.0.1:{PORT}/v2/health/ready')\"",
            f"CMD [{cmd}]",
            "",
        ]
    )


__all__ = [
    "DOCKER_FILE",
    "KSERVE_FILE",
    "RAY_FILE",
    "RAY_IMPORT_PATH",
    "TRITON_DIR",
    "bounds",
    "dns_name",
    "dockerfile",
    "kserve_manifest",
    "ray_config",
    "triton_config",
]
