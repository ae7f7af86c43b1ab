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
            max_batch(workload, gpu, task="train", precision=row.precision, eff=eff),
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


__all__ = ["DEFAULT_BATCH_CAP", "PublishedRow", "load_published", "predict"]
