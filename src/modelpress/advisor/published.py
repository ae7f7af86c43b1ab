"""Published measurements the advisor is checked and fitted against.

``advisor/data/calibration_benchmarks.csv`` is a verbatim copy of the project's shared file:
single-GPU (and a few multi-GPU) training throughputs of ResNet-50 and BERT-Large from a cloud
vendor's benchmark suite, and large-GEMM microbenchmarks. ``load_published`` reads the rows the
catalog can place; ``predict`` gives the advisor's figure for a row under given efficiency
factors, so a fit (``benchmarks/bench_advisor.py``) and the tests share one definition.

Rules for rows: ResNet-50 is the 224² image workload, BERT-Large SQuAD fine-tuning runs at
sequence 384; "AMP FP16" is mixed-precision fp16, "FP32/TF32" is tf32 (PyTorch's default for
convolutions on Ampere and later); a row without a batch size runs at the largest batch that fits,
at most ``DEFAULT_BATCH_CAP``. GEMM rows are predicted as the dense peak × ``gemm_ceiling``
(never from the device's own measured ceiling, which comes from these same rows).

``advisor/data/published_inference.csv`` is a HELD-OUT set of single-GPU inference throughputs,
with a source per row: NVIDIA TensorRT demoBERT (A100, A30, T4, V100), MLPerf Inference ResNet-50
Offline and SingleStream (TensorRT INT8 on A100, H100, L4, A10, A30, T4), NVIDIA's PyTorch
ResNet-50 inference tables (eager, V100 and T4) and TensorRT-LLM GPT-J 6B / Llama-2-7B (H100,
L40S, A100). Nothing is fitted to it: ``benchmarks/bench_advisor.py`` only reports the advisor's
error on it. Latency rows (``avg_latency_ms``) become samples/s = batch / latency; throughput
rows (``samples_per_s``) are taken as they are; LLM rows are output tokens/s (batch × generated
tokens / time for prefill plus decode). ``engine`` says how the row ran (``tensorrt``: a compiled
engine; ``pytorch``: eager). A GPU named loosely in the source ("V100 16GB") is written so in the
file and resolved by the catalog's loose-name rule, whose note the row keeps.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from importlib import resources

from modelpress.advisor.catalog import Catalog
from modelpress.advisor.efficiency import Efficiency
from modelpress.advisor.estimate import estimate, max_batch
from modelpress.errors import OptionError
from modelpress.profile.workloads import get_workload

DEFAULT_BATCH_CAP = 256
_PRECISION = {"AMP FP16": "fp16", "FP32/TF32": "tf32", "BF16": "bf16", "FP8 e4m3": "fp8"}


@dataclass(frozen=True)
class PublishedRow:
    model: str  # "resnet50", "bert-large" or "gemm"
    gpu: str  # catalog name
    precision: str
    batch: int | None
    num_gpus: int
    measured: float  # per GPU, in the row's unit
    unit: str
    source: str


def _workload_key(model: str) -> str | None:
    if model.startswith("ResNet-50"):
        return "resnet50"
    if model.startswith("BERT-Large"):
        return "bert-large"
    if model.startswith("GEMM"):
        return "gemm"
    return None


def load_published(catalog: Catalog) -> tuple[list[PublishedRow], list[str]]:
    """Rows the catalog can place, and a line for each row skipped (with the reason)."""
    text = (
        resources.files("modelpress.advisor")
        .joinpath("data/calibration_benchmarks.csv")
        .read_text()
    )
    rows, skipped = [], []
    for raw in csv.DictReader(text.splitlines()):
        label = f"{raw['model']} on {raw['gpu']} ({raw['precision']}, {raw['num_gpus']} GPU)"
        key = _workload_key(raw["model"])
        name = raw["spec_name"].replace("SXM2 32GB (16GB SXM2 variant)", "SXM2 16GB") or raw["gpu"]
        try:
            gpu = catalog.find(name)
        except OptionError:
            skipped.append(f"{label}: device not in the catalog")
            continue
        if key is None or raw["precision"] not in _PRECISION:
            skipped.append(f"{label}: workload or precision not modelled")
            continue
        batch = raw["batch_size"].rstrip("?").strip()
        rows.append(
            PublishedRow(
                model=key,
                gpu=gpu.name,
                precision=_PRECISION[raw["precision"]],
                batch=int(batch) if batch else None,
                num_gpus=int(raw["num_gpus"]),
                measured=float(raw["value_per_gpu"]),
                unit=raw["metric"],
                source=raw["source"],
            )
        )
    return rows, skipped


def predict(row: PublishedRow, catalog: Catalog, eff: Efficiency) -> float:
    """The advisor's per-GPU figure for ``row`` under efficiency factors ``eff``."""
    gpu = catalog.find(row.gpu)
    if row.model == "gemm":
        peak = gpu.peak_tflops(row.precision)
        return peak[0] * eff.gemm_ceiling if peak else float("nan")
    workload = get_workload(row.model, seq=384 if row.model == "bert-large" else None)
    batch = row.batch or max(
        1,
        min(
            DEFAULT_BATCH_CAP,
            max_batch(workload, gpu, task="train", precision=row.precision),
        ),
    )
    est = estimate(
        workload,
        gpu,
        task="train",
        precision=row.precision,
        batch=batch,
        num_gpus=row.num_gpus,
        eff=eff,
    )
    return est.throughput / row.num_gpus


@dataclass(frozen=True)
class InferenceRow:
    workload: str  # built-in workload name
    gpu: str  # catalog name
    precision: str
    batch: int
    seq: int | None  # (padded) sequence, or LLM prompt length; None for CNNs
    gen_tokens: int  # LLM output length; 0 for encoders and CNNs
    measured: float  # per GPU, in ``unit``
    unit: str
    source: str
    note: str
    engine: str = "compiled"  # how the published run executed: compiled or eager
    gpu_note: str = ""  # the catalog's note when the source names the GPU loosely

    @property
    def label(self) -> str:
        shape = (
            f" in {self.seq} out {self.gen_tokens}"
            if self.gen_tokens
            else f" seq {self.seq}"
            if self.seq
            else ""
        )
        eager = " eager" if self.engine == "eager" else ""
        return f"{self.workload} {self.precision}{eager} b{self.batch}{shape} on {self.gpu}"


_INFER_METRICS = {
    # metric in the file -> (unit, conversion of the published value at a batch)
    "avg_latency_ms": ("samples/s", lambda value, batch: batch * 1e3 / value),
    "output_tokens_per_s": ("tokens/s", lambda value, batch: value),
    "samples_per_s": ("samples/s", lambda value, batch: value),
}
_ENGINE = {"tensorrt": "compiled", "pytorch": "eager"}


def load_published_inference(catalog: Catalog) -> list[InferenceRow]:
    """The held-out inference rows; a row the catalog or the metrics cannot place is an error
    (the file ships with the package, so a bad row is a packaging bug, not a user's input)."""
    text = (
        resources.files("modelpress.advisor").joinpath("data/published_inference.csv").read_text()
    )
    rows = []
    for n, raw in enumerate(csv.DictReader(text.splitlines()), start=2):
        if (
            raw["metric"] not in _INFER_METRICS
            or raw["engine"] not in _ENGINE
            or not raw["source"].strip()
        ):
            raise OptionError(
                f"published_inference.csv line {n}: unknown metric or engine, or no source"
            )
        unit, convert = _INFER_METRICS[raw["metric"]]
        batch = int(raw["batch"])
        found = catalog.lookup(raw["gpu"])
        rows.append(
            InferenceRow(
                workload=raw["workload"],
                gpu=found.gpu.name,
                precision=raw["precision"],
                batch=batch,
                seq=int(raw["seq"]) if raw["seq"].strip() else None,
                gen_tokens=int(raw["gen_tokens"]),
                measured=convert(float(raw["value"]), batch),
                unit=unit,
                source=raw["source"],
                note=raw["note"],
                engine=_ENGINE[raw["engine"]],
                gpu_note=found.note,
            )
        )
    return rows


def predict_inference(row: InferenceRow, catalog: Catalog, eff: Efficiency):
    """The advisor's estimate (an ``Estimate``) for a held-out inference row."""
    workload = get_workload(row.workload, seq=row.seq, gen_tokens=row.gen_tokens)
    return estimate(
        workload,
        catalog.find(row.gpu),
        task="infer",
        precision=row.precision,
        batch=row.batch,
        eff=eff,
        engine=row.engine,
    )


__all__ = [
    "DEFAULT_BATCH_CAP",
    "InferenceRow",
    "PublishedRow",
    "load_published",
    "load_published_inference",
    "predict",
    "predict_inference",
]
