"""An LLM folder measured on this CPU, beside the advisor's CPU estimate of the same work.

Measured (``runtime.generate``, greedy, end-of-sequence ignored, the median of ``runs``):

- prefill: the time to the first token of a ``prompt_tokens``-token prompt (one pass of the
  decoder over the prompt, then the choice of the token);
- decode: milliseconds per token over the ``gen_tokens`` tokens after the first.

Estimated: the decoder graph profiled node by node (``profile.workload_from_onnx``) at the
prefill shape (``seq`` = the prompt, no past) and at a decode step (``seq`` 1, the past at the
middle of the measured tokens), timed on the roof this CPU shows (``advisor.calibrate``: fp32
matrix-product GFLOP/s, copy GB/s, per-node overhead), as ``advise --calibrate`` does for other
models. ``predicted / measured`` says how far the estimate is from this machine.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from modelpress.advisor.calibrate import (
    cpu_name,
    cpu_roof,
    measure_copy_gbs,
    measure_node_overhead_us,
    predict_cpu_ms,
)
from modelpress.errors import OptionError
from modelpress.ir import load
from modelpress.ir.llm import ATTENTION_MASK, INPUT_IDS, MODEL_FILE, past_names, read_config
from modelpress.profile.workload import workload_from_onnx
from modelpress.runtime.generate import Request, SamplingParams, Scheduler, open_llm
from modelpress.runtime.measure import machine_peak_gflops

FILLER = "The quick brown fox jumps over the lazy dog while the model writes one token at a time. "


@dataclass(frozen=True)
class Phase:
    """One phase of generation (prefill or decode) measured here, beside its estimate."""

    measured_ms: float  # median of the runs
    range_ms: tuple[float, float]
    predicted_ms: float
    bound: str

    @classmethod
    def of(cls, times_ms: list[float], predicted: tuple[float, str]) -> Phase:
        """The phase from its measured times and the estimate's (ms, bound)."""
        return cls(statistics.median(times_ms), (min(times_ms), max(times_ms)), *predicted)

    def to_dict(self, name: str) -> dict:
        """The record's keys for phase ``name``."""
        return {
            f"{name}_ms": self.measured_ms,
            f"{name}_range_ms": list(self.range_ms),
            f"predicted_{name}_ms": self.predicted_ms,
            f"{name}_bound": self.bound,
            f"{name}_predicted_over_measured": self.predicted_ms / self.measured_ms,
        }


@dataclass(frozen=True)
class LLMCalibration:
    folder: str
    cpu: str
    threads: int
    prompt_tokens: int
    gen_tokens: int
    runs: int
    prefill: Phase  # the time to the first token
    decode: Phase  # per token
    matmul_gflops: float
    copy_gbs: float
    node_overhead_us: float

    @property
    def decode_tokens_per_s(self) -> float:
        return 1e3 / self.decode.measured_ms

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k not in ("prefill", "decode")}
        return {
            **d,
            **self.prefill.to_dict("prefill"),
            **self.decode.to_dict("decode"),
            "decode_tokens_per_s": self.decode_tokens_per_s,
        }


def _dim_names(model) -> dict[str, str]:
    """The names the decoder gives its sequence, total and past dimensions."""

    def name(value, axis):
        dims = value.shape.dims if value.shape is not None else ()
        dim = getattr(dims[axis], "value", dims[axis]) if len(dims) > axis else None
        return dim if isinstance(dim, str) else None

    inputs = {v.name: v for v in model.graph.inputs}
    out = {
        "seq": name(inputs[INPUT_IDS], 1),
        "total": name(inputs[ATTENTION_MASK], 1),
        "past": name(inputs[past_names(0)[0]], 2),
    }
    return {k: v for k, v in out.items() if v}


def calibrate_llm(
    folder: str | os.PathLike, *, prompt_tokens: int = 256, gen_tokens: int = 32, runs: int = 3
) -> LLMCalibration:
    """Measure prefill and decode of the LLM folder ``folder`` here and estimate them."""
    config = read_config(folder)
    for name, value in (("prompt_tokens", prompt_tokens), ("gen_tokens", gen_tokens)):
        if not isinstance(value, int) or value < 2:
            raise OptionError(f"`{name}` must be an integer of at least 2, got {value!r}")
    if prompt_tokens + gen_tokens > config.max_context:
        raise OptionError(
            f"`prompt_tokens` + `gen_tokens` ({prompt_tokens + gen_tokens}) is over the model's "
            f"context of {config.max_context}"
        )
    llm = open_llm(folder)
    ids = llm.encode(FILLER * (prompt_tokens // 8 + 1), special=False)[:prompt_tokens]
    scheduler = Scheduler(llm, max_seqs=1)
    params = SamplingParams(max_tokens=gen_tokens + 1, ignore_eos=True)
    prefill, decode = [], []
    scheduler.run([Request(prompt_ids=ids[:16], params=SamplingParams(max_tokens=2))])  # warm
    for _ in range(runs):
        result = scheduler.run([Request(prompt_ids=ids, params=params)])[0]
        prefill.append(result.time_to_first_token_s * 1e3)
        decode.append(1e3 / result.tokens_per_s)

    model = load(Path(folder) / MODEL_FILE)
    names = _dim_names(model)
    past = prompt_tokens + gen_tokens // 2

    def dims(seq: int, past_len: int) -> dict[str, int]:
        values = {"seq": seq, "past": past_len, "total": past_len + seq}
        return {names[k]: v for k, v in values.items() if k in names}

    wl_prefill = workload_from_onnx(model, name="prefill", dims=dims(prompt_tokens, 0))
    wl_decode = workload_from_onnx(model, name="decode", dims=dims(1, past))
    gflops, copy = machine_peak_gflops(n=1024, runs=5), measure_copy_gbs()
    overhead = measure_node_overhead_us()
    roof = cpu_roof(gflops, copy)
    return LLMCalibration(
        folder=str(folder),
        cpu=cpu_name(),
        threads=os.cpu_count() or 1,
        prompt_tokens=prompt_tokens,
        gen_tokens=gen_tokens,
        runs=runs,
        prefill=Phase.of(
            prefill, predict_cpu_ms(wl_prefill, roof, batch=1, node_overhead_us=overhead)
        ),
        decode=Phase.of(
            decode, predict_cpu_ms(wl_decode, roof, batch=1, node_overhead_us=overhead)
        ),
        matmul_gflops=gflops,
        copy_gbs=copy,
        node_overhead_us=overhead,
    )


__all__ = ["LLMCalibration", "Phase", "calibrate_llm"]
