"""Each file of a deploy folder, read by the tool that reads it, where that tool is installed.

| file | checked by |
| --- | --- |
| ``serve.yaml`` | ``settings.read_folder`` (what ``modelpress serve DEPLOY_DIR`` runs) |
| ``ray-serve.yaml`` | Ray's own schema, ``ray.serve.schema.ServeDeploySchema`` (what ``serve run`` and ``serve deploy`` validate against) |
| ``triton/NAME/config.pbtxt`` | Triton's ``inference.ModelConfig`` protobuf (the copy ``tritonclient.grpc`` ships), text format: unknown fields and wrong enum names fail |
| ``kserve.yaml`` | the fields and types of KServe's ``v1beta1`` ``InferenceService`` that the file uses (the CRD's OpenAPI schema is not shipped in any package installable here); with the ``kserve`` package importable, also its generated models |
| ``Dockerfile`` | not checked here (no Docker): every instruction is one Docker knows |

``check_folder`` returns one ``Check`` per file: passed, failed with the reason, or skipped with
the tool that was missing.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from modelpress.deploy.platforms import DOCKER_FILE, KSERVE_FILE, RAY_FILE, TRITON_DIR
from modelpress.deploy.settings import SERVE_FILE, read_folder
from modelpress.errors import ModelpressError


@dataclass(frozen=True)
class Check:
    file: str
    tool: str
    status: str  # "ok", "failed", "skipped"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "failed"

    def to_dict(self) -> dict:
        return asdict(self)


def _yaml(path: Path):
    import yaml

    return yaml.safe_load(path.read_text())


def check_ray(path: Path) -> Check:
    name = path.name
    try:
        from ray.serve.schema import ServeDeploySchema
    except ImportError:
        return Check(name, "ray.serve.schema", "skipped", "Ray is not installed (the ray extra)")
    try:
        schema = ServeDeploySchema.model_validate(_yaml(path))
        # the schema keeps autoscaling_config a mapping; Ray reads it as AutoscalingConfig when
        # it applies the config: read it so here too
        from ray.serve.config import AutoscalingConfig

        for app in schema.applications:
            for dep in app.deployments:
                if isinstance(dep.autoscaling_config, dict):
                    AutoscalingConfig.model_validate(dep.autoscaling_config)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, and YAML's
        return Check(name, "ray.serve.schema.ServeDeploySchema", "failed", _first(exc))
    apps = [a.import_path for a in schema.applications]
    return Check(name, "ray.serve.schema.ServeDeploySchema", "ok", f"applications: {apps}")


def check_triton(path: Path) -> Check:
    name = str(Path(path.parent.name) / path.name)
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        return Check(
            name, "tritonclient model_config_pb2", "skipped", "tritonclient[grpc] is not installed"
        )
    try:
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError as exc:
        return Check(name, "tritonclient.grpc.model_config_pb2.ModelConfig", "failed", _first(exc))
    if config.name != path.parent.name:
        return Check(
            name,
            "tritonclient.grpc.model_config_pb2.ModelConfig",
            "failed",
            f"name {config.name!r} is not the model's folder {path.parent.name!r}",
        )
    if not (path.parent / "1" / "model.onnx").is_file():
        return Check(name, "model repository layout", "failed", "no version 1/model.onnx beside it")
    return Check(
        name,
        "tritonclient.grpc.model_config_pb2.ModelConfig",
        "ok",
        f"max_batch_size {config.max_batch_size}, "
        f"delay {config.dynamic_batching.max_queue_delay_microseconds} us",
    )


# The parts of KServe's v1beta1 InferenceService a deploy folder writes: field → type (or a nested
# table); ``*`` marks a required field. From the InferenceService CRD's OpenAPI schema (kserve
# config/crd), by hand: only what this writer emits, so a typo or a wrong type fails here.
_CONTAINER = {
    "*name": str,
    "*image": str,
    "args": list,
    "env": list,
    "ports": list,
    "resources": {"requests": dict, "limits": dict},
    "readinessProbe": dict,
}
_PREDICTOR = {
    "minReplicas": int,
    "maxReplicas": int,
    "scaleMetric": ("cpu", "memory", "concurrency", "rps"),
    "scaleTarget": int,
    "containers": [_CONTAINER],
}
_ISVC = {
    "*apiVersion": ("serving.kserve.io/v1beta1",),
    "*kind": ("InferenceService",),
    "*metadata": {"*name": str, "labels": dict, "annotations": dict, "namespace": str},
    "*spec": {"*predictor": _PREDICTOR},
}
_DNS = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _walk(value, spec, where: str) -> None:
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected a mapping")
        fields = {k.lstrip("*"): v for k, v in spec.items()}
        for k in spec:
            if k.startswith("*") and k[1:] not in value:
                raise ValueError(f"{where}.{k[1:]}: required")
        for k, v in value.items():
            if k not in fields:
                raise ValueError(f"{where}.{k}: not a field of InferenceService")
            _walk(v, fields[k], f"{where}.{k}")
    elif isinstance(spec, list):
        if not isinstance(value, list) or not value:
            raise ValueError(f"{where}: expected a non-empty list")
        for i, item in enumerate(value):
            _walk(item, spec[0], f"{where}[{i}]")
    elif isinstance(spec, tuple):
        if value not in spec:
            raise ValueError(f"{where}: {value!r} is not one of {', '.join(map(str, spec))}")
    elif not isinstance(value, spec) or (spec is int and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {spec.__name__}, got {value!r}")


def _kserve_models(data: dict) -> str | None:
    """Round-trip through the ``kserve`` package's generated models, when it can be imported:
    None when it cannot, else what it said."""
    try:
        models = importlib.import_module("kserve.models")
        k8s = importlib.import_module("kubernetes.client")
    except Exception:  # noqa: BLE001 - kserve pulls in many packages; any missing one skips
        return None
    pred = data["spec"]["predictor"]
    containers = [
        k8s.ApiClient()._ApiClient__deserialize(c, "V1Container") for c in pred["containers"]
    ]
    isvc = models.V1beta1InferenceService(
        api_version=data["apiVersion"],
        kind=data["kind"],
        metadata=k8s.V1ObjectMeta(**{k: v for k, v in data["metadata"].items()}),
        spec=models.V1beta1InferenceServiceSpec(
            predictor=models.V1beta1PredictorSpec(
                min_replicas=pred.get("minReplicas"),
                max_replicas=pred.get("maxReplicas"),
                scale_metric=pred.get("scaleMetric"),
                scale_target=pred.get("scaleTarget"),
                containers=containers,
            )
        ),
    )
    client = k8s.ApiClient()

    def plain(obj):  # kserve's models by their wire names; Kubernetes' by its own client
        if isinstance(obj, list):
            return [plain(v) for v in obj]
        if isinstance(obj, dict):
            return {k: plain(v) for k, v in obj.items()}
        if hasattr(obj, "attribute_map") and hasattr(obj, "openapi_types"):
            return {
                obj.attribute_map[a]: plain(getattr(obj, a))
                for a in obj.openapi_types
                if getattr(obj, a) is not None
            }
        return client.sanitize_for_serialization(obj)

    back = plain(isvc)
    if back != data:
        return f"the kserve models give back {back}, not the manifest"
    return "ok"


def check_kserve(path: Path) -> Check:
    name = path.name
    tool = "InferenceService v1beta1 fields and types"
    try:
        data = _yaml(path)
        _walk(data, _ISVC, "InferenceService")
        if not _DNS.match(data["metadata"]["name"]) or len(data["metadata"]["name"]) > 63:
            raise ValueError("metadata.name: not a DNS-1123 label")
        pred = data["spec"]["predictor"]
        if pred.get("minReplicas", 1) > pred.get("maxReplicas", pred.get("minReplicas", 1)):
            raise ValueError("spec.predictor: minReplicas is above maxReplicas")
        for c in pred["containers"]:
            for port in c.get("ports", []):
                if not (
                    isinstance(port.get("containerPort"), int) and 0 < port["containerPort"] < 65536
                ):
                    raise ValueError(f"container {c['name']}: containerPort must be 1-65535")
        said = _kserve_models(data)
    except Exception as exc:  # noqa: BLE001 - YAML errors, and the models' ValueError
        return Check(name, tool, "failed", _first(exc))
    if said is not None:
        tool += " + kserve.models"
        if said != "ok":
            return Check(name, tool, "failed", said)
    return Check(name, tool, "ok")


_DOCKER = {
    "FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
    "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL",
}  # fmt: skip


def check_dockerfile(path: Path) -> Check:
    lines = [ln.strip() for ln in path.read_text().splitlines()]
    instructions = [ln.split()[0].upper() for ln in lines if ln and not ln.startswith("#")]
    bad = [i for i in instructions if i not in _DOCKER]
    if bad or not instructions or instructions[0] not in ("FROM", "ARG"):
        return Check(
            path.name, "Dockerfile instructions", "failed", f"unknown instruction {bad[:1]}"
        )
    return Check(path.name, "Dockerfile instructions", "ok", "not built here (no Docker)")


def check_folder(folder: str | Path) -> list[Check]:
    """Every file of the deploy folder, read by its tool (see the module docstring)."""
    folder = Path(folder)
    out = []
    try:
        settings, _ = read_folder(folder)
        out.append(Check(SERVE_FILE, "modelpress serve", "ok"))
    except ModelpressError as exc:
        return [Check(SERVE_FILE, "modelpress serve", "failed", str(exc))]
    out.append(check_ray(folder / RAY_FILE))
    out.append(check_kserve(folder / KSERVE_FILE))
    config = folder / TRITON_DIR / settings.name / "config.pbtxt"
    if config.is_file():
        out.append(check_triton(config))
    out.append(check_dockerfile(folder / DOCKER_FILE))
    return out


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return " ".join(text.splitlines()[:3]) if text else type(exc).__name__


__all__ = ["Check", "check_dockerfile", "check_folder", "check_kserve", "check_ray", "check_triton"]
