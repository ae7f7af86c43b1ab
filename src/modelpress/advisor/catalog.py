"""The accelerator catalog: a table with a source for every number, read into frozen dataclasses.

``advisor/data/gpus.csv`` was built from the project's shared reference table; its ``changes``
column says which numbers were changed and why, and each ``src_*`` column names where the numbers
of its group come from (see ``SOURCE_OF``). Tensor peaks are dense (vendor sheets often print the
2:4-sparse figure, twice as large). Prices and cloud rates are defaults, not live quotes.
``sm_count`` (streaming multiprocessors, or AMD compute units) feeds the estimator's wave
quantisation; a row left empty (TPUs, and GPUs whose count could not be sourced) turns that
model off for the device.

Users add or override entries with a CSV or JSON file of the same columns (``load_catalog(extra=)``):
a row whose name matches an entry replaces the fields it fills, any other row is a new entry.
Names match loosely: case, punctuation, vendor words and ``SXM4``/``SXM5`` spelling are ignored,
and every word of the query must appear in the entry's name or aliases. A name several variants
share ("V100", "A100 80GB") resolves to the most common variant (the entry whose ``default_for``
lists it, with the reason in ``src_default``) and ``Catalog.lookup`` says so in a note.

``base_clock_mhz`` / ``boost_clock_mhz`` (``src_clock``) feed the sustained-clock model of
``sustained_clock``: a power-limited card does not hold the boost clock its datasheet peaks assume.
"""

from __future__ import annotations

import csv
import difflib
import json
import re
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

from modelpress.errors import InputError, OptionError

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "int8")
_PEAK_FIELD = {
    "fp32": "fp32_tflops",
    "tf32": "tf32_tflops",
    "fp16": "fp16_tflops",
    "bf16": "bf16_tflops",
    "fp8": "fp8_tflops",
    "int8": "int8_tops",
}
NUMERIC = (
    "memory_gb",
    "memory_bandwidth_gbs",
    *_PEAK_FIELD.values(),
    "matmul_bf16_tflops_measured",
    "tdp_w",
    "nvlink_gbs",
    "nvlink_max_gpus",
    "pcie_gbs",
    "sm_count",
    "base_clock_mhz",
    "boost_clock_mhz",
    "l2_mb",
    "launch_year",
    "price_usd",
    "cloud_usd_hr",
)
# Which source column vouches for each number.
SOURCE_OF = {
    "memory_gb": "src_memory",
    "memory_bandwidth_gbs": "src_memory",
    **dict.fromkeys((*_PEAK_FIELD.values(), "launch_year"), "src_compute"),
    "matmul_bf16_tflops_measured": "src_measured",
    "sm_count": "src_sm",
    **dict.fromkeys(("base_clock_mhz", "boost_clock_mhz"), "src_clock"),
    "l2_mb": "src_l2",
    "tdp_w": "src_power",
    **dict.fromkeys(("nvlink_gbs", "nvlink_max_gpus", "pcie_gbs"), "src_interconnect"),
    "price_usd": "src_price",
    "cloud_usd_hr": "src_cloud",
}
# A precision a device lacks runs at the next one it has: TF32 without TF32 units is plain FP32,
# FP8 on pre-Hopper GPUs is computed in 16 bits, FP16 on TPUs is BF16.
_FALLBACK = {
    "fp32": ("fp32",),
    "tf32": ("tf32", "fp32"),
    "fp16": ("fp16", "bf16"),
    "bf16": ("bf16", "fp32"),
    "fp8": ("fp8", "fp16", "bf16"),
    "int8": ("int8", "fp16", "bf16"),
}
_STOPWORDS = {"nvidia", "geforce", "amd", "instinct", "google", "tesla", "hgx", "generation", "gpu"}


@dataclass(frozen=True)
class GPU:
    name: str
    vendor: str
    architecture: str
    memory_gb: float
    memory_bandwidth_gbs: float
    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    fp16_tflops: float | None = None
    bf16_tflops: float | None = None
    fp8_tflops: float | None = None
    int8_tops: float | None = None
    matmul_bf16_tflops_measured: float | None = None
    tdp_w: float | None = None
    nvlink_gbs: float | None = None  # bidirectional aggregate per device
    nvlink_max_gpus: float | None = None
    pcie_gbs: float | None = None  # bidirectional
    sm_count: float | None = None  # streaming multiprocessors (NVIDIA) / compute units (AMD)
    # clock guaranteed at the TDP under a worst-case load, and the rated boost clock that the
    # datasheet peaks assume (see ``sustained_clock``)
    base_clock_mhz: float | None = None
    boost_clock_mhz: float | None = None
    l2_mb: float | None = None  # last-level cache: activations that fit stay on chip
    form_factor: str = ""
    launch_year: float | None = None
    price_usd: float | None = None
    cloud_usd_hr: float | None = None
    aliases: tuple[str, ...] = ()
    # loose names this entry answers for when several variants match (the most common one)
    default_for: tuple[str, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()  # (source column, text)
    changes: str = ""

    def peak_tflops(self, precision: str) -> tuple[float, str] | None:
        """Dense peak for ``precision`` (TFLOPS or TOPS) and the precision it really runs at.

        A float precision the device lacks runs at the first fallback it has. An 8-bit precision
        is a permission, not an obligation: an inference engine (TensorRT picks the fastest
        kernel per layer) runs 16-bit kernels where they are faster, so 8-bit work gets the best
        peak of the chain (the V100's INT8 is DP4A on the CUDA cores at 62.8 TOPS, half its FP16
        tensor peak, and TensorRT INT8 BERT runs at its FP16 speed).
        """
        found = [
            (float(getattr(self, _PEAK_FIELD[p])), p)
            for p in _FALLBACK[precision]
            if getattr(self, _PEAK_FIELD[p])
        ]
        if not found:
            return None
        if precision in ("int8", "fp8"):
            return max(found, key=lambda f: f[0])  # the first on a tie
        return found[0]

    def own_peak(self, precision: str) -> float | None:
        """The catalog's peak for ``precision`` itself (no fallback), None when it has none."""
        value = getattr(self, _PEAK_FIELD[precision])
        return float(value) if value else None

    def vector_tflops(self) -> float:
        """Peak of the non-tensor (vector) units, which run elementwise ops."""
        return float(self.fp32_tflops or (self.bf16_tflops or 0) / 8 or 1.0)

    def source(self, number: str) -> str:
        return dict(self.sources).get(SOURCE_OF[number], "")

    def link_gbs(self, num_gpus: int) -> tuple[float, str] | None:
        """Per-direction bandwidth between ``num_gpus`` devices and the link's name."""
        if self.nvlink_gbs and num_gpus <= (self.nvlink_max_gpus or 0):
            return self.nvlink_gbs / 2, "NVLink" if self.vendor == "NVIDIA" else "scale-up link"
        if self.pcie_gbs:
            return self.pcie_gbs / 2, "PCIe"
        return None


def _tokens(name: str) -> tuple[str, ...]:
    s = name.lower()
    s = re.sub(r"sxm[0-9]", "sxm", s)
    s = re.sub(r"(\d+)\s*gb\b", r"\1gb", s)
    return tuple(t for t in re.split(r"[^a-z0-9]+", s) if t and t not in _STOPWORDS)


def _number(text: str, *, where: str, column: str) -> float | None:
    text = (text or "").strip()
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise InputError(f"{where}: column {column} has {text!r}, expected a number") from None


def _gpu_from_row(
    row: dict, *, where: str, base: GPU | None = None, default_source: str = ""
) -> GPU:
    values: dict = {}
    for key in NUMERIC:
        if key in row and str(row[key]).strip() != "":
            values[key] = _number(str(row[key]), where=where, column=key)
    for key in ("vendor", "architecture", "form_factor", "changes"):
        if str(row.get(key) or "").strip():
            values[key] = str(row[key]).strip()
    if str(row.get("aliases") or "").strip():
        values["aliases"] = tuple(a.strip() for a in str(row["aliases"]).split(";") if a.strip())
    if str(row.get("default_for") or "").strip():
        values["default_for"] = tuple(
            a.strip() for a in str(row["default_for"]).split(";") if a.strip()
        )
    sources = dict(base.sources) if base else {}
    for key in (*set(SOURCE_OF.values()), "src_default"):
        if str(row.get(key) or "").strip():
            sources[key] = str(row[key]).strip()
    for key in values:
        if key in SOURCE_OF and SOURCE_OF[key] not in {
            k for k in row if str(row.get(k) or "").strip()
        }:
            # a user's number without a stated source is vouched for by the user's file
            if default_source:
                sources[SOURCE_OF[key]] = default_source
    values["sources"] = tuple(sorted(sources.items()))
    if base is not None:
        return replace(base, **values)
    for key in ("memory_gb", "memory_bandwidth_gbs"):
        if values.get(key) is None:
            raise InputError(f"{where}: new entry {row.get('name')!r} needs {key}")
    return GPU(
        name=str(row["name"]).strip(),
        vendor=values.pop("vendor", ""),
        architecture=values.pop("architecture", ""),
        **values,
    )


def _read_rows(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}: not valid JSON ({exc})") from None
        rows = data.get("gpus", data) if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InputError(f'{path}: expected a list of GPU objects (or {{"gpus": [...]}})')
        return rows
    return list(csv.DictReader(text.splitlines()))


@dataclass(frozen=True)
class Catalog:
    gpus: tuple[GPU, ...]

    def names(self) -> list[str]:
        return [g.name for g in self.gpus]

    def find(self, query: str) -> GPU:
        """The one entry ``query`` names (see ``lookup``)."""
        return self.lookup(query).gpu

    def lookup(self, query: str) -> Lookup:
        """The entry ``query`` names, loosely, and a note when the name was ambiguous.

        Every word of the query must appear in an entry's name or aliases. One entry whose name
        or alias is exactly the query wins; so does a single match. A name that several variants
        share (``V100 16GB``: SXM2 and PCIe) resolves to the entry whose ``default_for`` lists it,
        the most common variant, with a note saying so and why (``src_default``). Any other
        ambiguity, or no match, is an error that lists the candidates or suggests close names.
        """
        q = _tokens(query)
        if not q:
            raise OptionError(f"`gpu` {query!r}: empty name")
        matches, exact = [], []
        for gpu in self.gpus:
            labels = [_tokens(label) for label in (gpu.name, *gpu.aliases)]
            if any(set(q) <= set(t) for t in labels):
                matches.append(gpu)
                if q in labels:
                    exact.append(gpu)
        if len(exact) == 1:
            return Lookup(exact[0])
        if len(matches) == 1:
            return Lookup(matches[0])
        if matches:
            common = [g for g in matches if q in map(_tokens, g.default_for)]
            if len(common) == 1:
                gpu = common[0]
                # the reason, without its sources (in parentheses; the catalog has them)
                why = dict(gpu.sources).get("src_default", "").split(" (")[0]
                others = ", ".join(g.name for g in matches if g is not gpu)
                note = (
                    f"{query!r} also fits {others}; took {gpu.name}, the most common variant"
                    + (f": {why}" if why else "")
                    + "; name the variant to choose another"
                )
                return Lookup(gpu, note)
            raise OptionError(
                f"`gpu` {query!r} is ambiguous: it matches {', '.join(g.name for g in matches)}; name one"
            )
        labels = {
            " ".join(_tokens(label)): g.name for g in self.gpus for label in (g.name, *g.aliases)
        }
        close = difflib.get_close_matches(" ".join(q), list(labels), n=3, cutoff=0.5)
        hint = (
            f"; did you mean {', '.join(dict.fromkeys(labels[c] for c in close))}?"
            if close
            else "; see `modelpress advise --list-gpus`"
        )
        raise OptionError(f"`gpu` {query!r}: no such accelerator in the catalog{hint}")


@dataclass(frozen=True)
class Lookup:
    """The entry a name resolved to, and the note to show when it was a loose name."""

    gpu: GPU
    note: str = ""


def load_catalog(extra: list[str | Path] | None = None) -> Catalog:
    """The built-in catalog, with entries added or overridden by the user's CSV/JSON files."""
    text = resources.files("modelpress.advisor").joinpath("data/gpus.csv").read_text()
    gpus: list[GPU] = []
    for n, row in enumerate(csv.DictReader(text.splitlines()), start=2):
        gpus.append(_gpu_from_row(row, where=f"gpus.csv line {n}"))
    for path in extra or []:
        p = Path(path)
        for n, row in enumerate(_read_rows(p), start=1):
            where = f"{p} entry {n}"
            if not str(row.get("name") or "").strip():
                raise InputError(f"{where}: every entry needs a name")
            key = _tokens(str(row["name"]))
            idx = next(
                (
                    i
                    for i, g in enumerate(gpus)
                    if _tokens(g.name) == key or key in map(_tokens, g.aliases)
                ),
                None,
            )
            base = gpus[idx] if idx is not None else None
            gpu = _gpu_from_row(row, where=where, base=base, default_source=f"user file {p.name}")
            if idx is None:
                gpus.append(gpu)
            else:
                gpus[idx] = gpu
    return Catalog(tuple(gpus))


GPU_FIELDS = tuple(f.name for f in fields(GPU))

__all__ = ["GPU", "NUMERIC", "PRECISIONS", "SOURCE_OF", "Catalog", "Lookup", "load_catalog"]
