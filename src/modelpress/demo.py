"""The demo: the whole flow on a model modelpress builds itself, one function per step.

Each step takes the shared ``DemoState``, does its work, stores what later steps need in the state
and returns a result dataclass; ``STEPS`` lists them in order. The CLI (``modelpress demo``) runs the
steps and prints each result, so a later stage (quantize, advise) is one more function here and one
more printer there.

The model is the zoo's ``resnet-digits`` (a ResNet-style CNN with BatchNorm and residual blocks,
trained on scikit-learn's digits in seconds). It is converted from PyTorch with a dynamic batch,
inspected, optimized, timed under ONNX Runtime before and after (interleaved runs, medians), and
scored on the digits test split. A last step takes a BERT-style encoder through optimization and
dynamic int8, the transformer path.
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress import zoo
from modelpress.advisor import load_catalog
from modelpress.advisor.measured import measure_curve, this_machine
from modelpress.advisor.service import plan_service
from modelpress.compress import quantize as run_quantizer
from modelpress.compress.llm import quantize_llm
from modelpress.convert import convert as convert_model
from modelpress.convert.llm import convert_llm
from modelpress.ir import from_proto, graph_stats, load, model_bytes, save, to_proto
from modelpress.passes import optimize as run_optimizer
from modelpress.profile import profile_model
from modelpress.profile.workload import workload_from_onnx
from modelpress.protect import keygen, load_key, open_package
from modelpress.protect import protect as protect_model
from modelpress.runtime.generate import generate
from modelpress.runtime.ort import session, use_global_thread_pool
from modelpress.verify import verify
from modelpress.verify.llm import Decoder as LLMDecoder
from modelpress.verify.llm import top1_agreement
from modelpress.verify.metrics import accuracy, mean_cosine
from modelpress.zoo import build as build_zoo
from modelpress.zoo import digits_data, sample_inputs
from modelpress.zoo.llm import tiny_checkpoint

ZOO_MODEL = "resnet-digits"


@dataclass
class DemoState:
    out_dir: Path
    latency_runs: int = 200
    module: object = None  # the trained torch.nn.Module
    example: tuple = ()
    input_name: str = "x"
    models: dict[str, ir.Model] = field(
        default_factory=dict
    )  # label -> model ("original", "optimized")
    paths: dict[str, Path] = field(default_factory=dict)
    verified: dict[str, bool] = field(default_factory=dict)
    latency: dict[str, dict[str, LatencyStats]] = field(
        default_factory=dict
    )  # ort level -> label -> stats
    accuracy: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildResult:
    name: str
    description: str
    parameters: int
    train_images: int
    test_images: int
    torch_accuracy: float
    seconds: float


@dataclass(frozen=True)
class InspectResult:
    stats: object  # modelpress.ir.GraphStats
    flops: float
    bytes: int


@dataclass(frozen=True)
class OptimizeStepResult:
    nodes_before: int
    nodes_after: int
    rewrites: dict[str, int]
    verify: object  # modelpress.verify.VerifyResult
    seconds: float


@dataclass(frozen=True)
class LatencyStats:
    median_ms: float
    p25_ms: float
    p75_ms: float
    runs: int


@dataclass(frozen=True)
class SummaryRow:
    label: str
    nodes: int
    size_bytes: int
    latency: dict[str, LatencyStats]
    accuracy: float
    verified: bool


# ---------------------------------------------------------------------------------------------
# steps


def build(state: DemoState) -> BuildResult:
    import torch

    start = time.perf_counter()
    module, example = zoo.build_torch(ZOO_MODEL)
    state.module, state.example = module, example
    state.input_name = next(iter(inspect.signature(module.forward).parameters))
    data = zoo.digits_data()
    with torch.no_grad():
        logits = module(torch.from_numpy(data.x_test)).numpy()
    return BuildResult(
        name=ZOO_MODEL,
        description=zoo.get(ZOO_MODEL).description,
        parameters=sum(p.numel() for p in module.parameters()),
        train_images=len(data.x_train),
        test_images=len(data.x_test),
        torch_accuracy=accuracy(logits, data.y_test),
        seconds=time.perf_counter() - start,
    )


def convert(state: DemoState):
    """PyTorch → ONNX with a dynamic batch, verified against the PyTorch model.

    The exporter's own clean-up is off, so the ONNX graph mirrors the PyTorch model layer for layer
    (BatchNorm unfused), as most exporters and older toolchains write it: the optimize step then
    shows what modelpress's optimizer does with such a graph.
    """

    path = state.out_dir / "model.onnx"
    result = convert_model(
        state.module,
        example_inputs=state.example,
        dynamic={state.input_name: 0},
        output=path,
        exporter_optimizations=False,
    )
    state.models["original"] = result.model
    state.paths["original"] = path
    state.verified["original"] = result.verify is not None and result.verify.passed
    return result


def inspect_model(state: DemoState) -> InspectResult:

    model = state.models["original"]
    cost = profile_model(model, {state.input_name: (1, 1, 32, 32)})
    return InspectResult(stats=graph_stats(model), flops=cost.flops, bytes=cost.bytes)


def optimize(state: DemoState) -> OptimizeStepResult:

    original = state.models["original"]
    result = run_optimizer(from_proto(to_proto(original)), level=2)
    check = verify(original, result.model, dims={}, input_sets=3)
    check.raise_if_failed("the optimized demo model and the converted one")
    path = state.out_dir / "model.opt.onnx"
    save(result.model, path)
    state.models["optimized"] = result.model
    state.paths["optimized"] = path
    state.verified["optimized"] = check.passed
    return OptimizeStepResult(
        nodes_before=graph_stats(original).node_count,
        nodes_after=graph_stats(result.model).node_count,
        rewrites={p.name: p.rewrites for p in result.passes if p.rewrites},
        verify=check,
        seconds=result.seconds,
    )


@dataclass(frozen=True)
class QuantizeStepResult:
    mode: str
    size_before: int
    size_after: int
    output_error: float | None
    seconds: float
    notes: list[str]


def quantize(state: DemoState) -> QuantizeStepResult:
    """Static int8 (uint8 activations, int8 per-channel weights) calibrated on 256 training images."""

    x = digits_data().x_train[:256]
    calibration = [{state.input_name: x[i : i + 32]} for i in range(0, len(x), 32)]
    result = run_quantizer(state.models["optimized"], mode="static", data=calibration)
    path = state.out_dir / "model.int8.onnx"
    save(result.model, path)
    state.models["int8"] = result.model
    state.paths["int8"] = path
    # A lossy step is judged by the user's metric (accuracy, next steps), not by float tolerances;
    # it "verifies" when ONNX Runtime's kernels here compute what its scales imply (the check).
    state.verified["int8"] = result.check is not None and result.check.verified
    notes = [*result.notes, f"int8 formats for {result.target} CPUs (this one)", *result.failures]
    return QuantizeStepResult(
        result.mode,
        result.size_before,
        result.size_after,
        result.output_error,
        result.seconds,
        notes,
    )


@dataclass(frozen=True)
class ProtectStepResult:
    path: Path
    bytes: int
    metrics: object  # modelpress.protect.ProtectionMetrics
    max_rel: float  # outputs of the package, opened and run, against the int8 model's
    seconds: float


def protect(state: DemoState) -> ProtectStepResult:
    """The int8 model obfuscated (runtime mode: anonymous op types, keyed weights whose inverse
    runs inside it) and encrypted with a new key; opened in memory and run, its outputs against
    the int8 model's on the test split."""

    key_file = state.out_dir / "demo.key"
    if not key_file.exists():
        keygen(key_file)
    key = load_key(key_file=key_file)
    path = state.out_dir / "model.int8.mpk"
    result = protect_model(
        state.models["int8"], key=key, output=path, obfuscate=True, ratio=0.3, seed=0
    )
    x = digits_data().x_test[:64]
    want = session(state.models["int8"]).run(None, {state.input_name: x})[0]
    got = session(open_package(path, key)).run(None, {state.input_name: x})[0]
    max_rel = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-12))
    return ProtectStepResult(path, result.bytes, result.metrics, max_rel, result.seconds)


@dataclass(frozen=True)
class AdviseStepResult:
    plan: object  # modelpress.advisor.service.ServicePlan


# The service the demo plans: a request rate and a tail latency an online digit reader might have.
SERVICE_QPS = 2000.0
SERVICE_P99_MS = 5.0


def advise(state: DemoState) -> AdviseStepResult:
    """How many of which GPU (or of this machine's CPU, measured on the int8 model) serve 2,000
    requests a second at a 5 ms p99 with dynamic batching, what it costs per million requests,
    and the ``serve --max-batch/--max-delay-ms`` to use."""

    catalog = load_catalog(None)
    candidates = [
        catalog.find(n)
        for n in ("NVIDIA L4", "NVIDIA A100 SXM4 80GB", "NVIDIA H100 SXM5 80GB", "RTX 4090")
    ]
    workload = workload_from_onnx(state.models["optimized"], name=ZOO_MODEL)
    curve = measure_curve(
        state.models["int8"], target_s=SERVICE_P99_MS / 1e3, limit=64, budget_s=5.0
    )
    plan = plan_service(
        workload,
        candidates,
        qps=SERVICE_QPS,
        p99_ms=SERVICE_P99_MS,
        precision="int8",
        machine=this_machine(curve),
    )
    return AdviseStepResult(plan=plan)


@dataclass(frozen=True)
class TransformerStepResult:
    name: str
    size_before: int
    size_after: int
    cosine: float  # mean cosine similarity of int8 vs float32 outputs, per sequence
    latency: dict[str, LatencyStats]  # "float32", "optimized", "int8": batch 8, sequence 128
    notes: list[str]


def transformer(state: DemoState) -> TransformerStepResult:
    """A transformer through the same flow: the zoo's BERT-style encoder (random weights), optimized
    and dynamically quantized with calibration (activation outliers moved into the weights); int8
    vs float32 outputs on padded sentences, and latency. The opset stays 12: ONNX Runtime fuses its
    primitive LayerNorms into a faster kernel than opset 17's LayerNormalization runs on."""

    name = "bert-tiny"
    src = build_zoo(name, state.out_dir / f"{name}.onnx")
    original = load(src)
    optimized = run_optimizer(original, level=2).model
    calibration = [sample_inputs(name, batch=8, seq=64) for _ in range(1)]
    calibration += [
        {k: np.roll(v, i, axis=0) for k, v in calibration[0].items()} for i in range(1, 4)
    ]
    result = run_quantizer(optimized, mode="dynamic", data=calibration, optimize=False)
    save(result.model, state.out_dir / f"{name}.int8.onnx")
    feeds = sample_inputs(name, batch=8, seq=128)
    models = {"float32": original, "optimized": optimized, "int8": result.model}
    sessions = {k: session(m) for k, m in models.items()}
    outputs = {k: s.run(None, feeds)[0] for k, s in sessions.items()}
    cosine = mean_cosine(outputs["float32"], outputs["int8"])
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for _ in range(max(5, state.latency_runs // 4)):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run(None, feeds)
            times[k].append((time.perf_counter() - t0) * 1e3)
    stats = {
        k: LatencyStats(
            float(np.median(t)), float(np.percentile(t, 25)), float(np.percentile(t, 75)), len(t)
        )
        for k, t in times.items()
    }
    return TransformerStepResult(
        name,
        len(model_bytes(original)),
        len(model_bytes(result.model)),
        cosine,
        stats,
        list(result.notes),
    )


def latency(state: DemoState) -> dict[str, dict[str, LatencyStats]]:
    """Median latency of one image, ORT with its optimizations off and fully on, runs interleaved.

    "disabled" stands for a runtime without a graph optimizer of its own; interleaving the models
    run by run spreads the noise of a shared machine evenly over them.
    """

    use_global_thread_pool(intra_op_threads=1)
    x = digits_data().x_test[:1]
    feeds = {state.input_name: x}
    out: dict[str, dict[str, LatencyStats]] = {}
    for level in ("disabled", "all"):
        sessions = {label: session(m, optimize=level) for label, m in state.models.items()}
        times: dict[str, list[float]] = {label: [] for label in sessions}
        for sess in sessions.values():  # warm-up
            sess.run(None, feeds)
        for _ in range(state.latency_runs):
            for label, sess in sessions.items():
                t0 = time.perf_counter()
                sess.run(None, feeds)
                times[label].append((time.perf_counter() - t0) * 1e3)
        out[level] = {
            label: LatencyStats(
                float(np.median(t)),
                float(np.percentile(t, 25)),
                float(np.percentile(t, 75)),
                len(t),
            )
            for label, t in times.items()
        }
    state.latency = out
    return out


def evaluate(state: DemoState) -> dict[str, float]:
    """Top-1 accuracy of every model on the digits test split, under ONNX Runtime."""

    data = digits_data()
    for label, model in state.models.items():
        logits = session(model, optimize="disabled").run(None, {state.input_name: data.x_test})[0]
        state.accuracy[label] = accuracy(logits, data.y_test)
    return dict(state.accuracy)


def summary(state: DemoState) -> list[SummaryRow]:

    rows = []
    for label, model in state.models.items():
        rows.append(
            SummaryRow(
                label=label,
                nodes=graph_stats(model).node_count,
                size_bytes=state.paths[label].stat().st_size,
                latency={level: by_label[label] for level, by_label in state.latency.items()},
                accuracy=state.accuracy.get(label, float("nan")),
                verified=state.verified.get(label, False),
            )
        )
    return rows


@dataclass(frozen=True)
class DecoderStepResult:
    family: str
    layers: int
    float_bytes: int
    int4_bytes: int
    max_logit_diff: float  # the converted decoder against transformers, prompt and cached steps
    prompt: str
    float_text: str
    int4_text: str
    top1_agreement: float  # int4's next token equal to float's, along float's greedy path
    tokens_per_s: float
    chat_answer: str  # what the server answered to one chat request (OpenAI route)
    notes: list[str]


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def _served_chat(folder: Path, message: str) -> str:
    """One chat request to ``modelpress serve FOLDER`` on the OpenAI route, the server in its own
    process on a free port of 127.0.0.1, stopped (SIGTERM, drained) afterwards."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "modelpress.cli.main", "serve", str(folder)]
    proc = subprocess.Popen(
        [*cmd, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                urllib.request.urlopen(f"{base}/v1/models", timeout=2).read()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                    raise RuntimeError(f"the LLM server did not start: {err[-300:]}") from None
                time.sleep(0.2)
        body = {
            "model": folder.name,
            "messages": [{"role": "user", "content": message}],
            "max_tokens": 16,
        }
        req = urllib.request.Request(
            f"{base}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        answer = json.loads(urllib.request.urlopen(req, timeout=120).read())
        return answer["choices"][0]["message"]["content"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def decoder(state: DemoState) -> DecoderStepResult:
    """A decoder LLM through its road: a tiny Llama-style checkpoint (random weights, built by
    transformers at a fixed seed) converted with its KV cache and verified against transformers,
    quantized to int4 blocks, generated from greedily, and asked one chat question through the
    OpenAI-compatible server. Random weights speak no language: the point is the path, and that
    int4 follows float."""

    ckpt = tiny_checkpoint(state.out_dir / "llm-checkpoint", "llama", seed=0)
    float_dir = state.out_dir / "llm"
    int4_dir = state.out_dir / "llm-int4"
    converted = convert_llm(ckpt, output=float_dir)
    quantized = quantize_llm(float_dir, int4_dir, mode="int4", block_size=32)
    prompt = "the quick brown fox"
    kwargs = {"max_tokens": 16, "chat_template": False}
    ref = generate(float_dir, prompt, **kwargs)
    got = generate(int4_dir, prompt, **kwargs)
    reference, candidate = LLMDecoder.open(float_dir), LLMDecoder.open(int4_dir)
    prompts = [np.asarray(reference.tokenizer.encode(p).ids) for p in (prompt, "hello world")]
    agreement = top1_agreement(reference, candidate, prompts, steps=16)
    check = converted.verify
    return DecoderStepResult(
        family=converted.config.family,
        layers=converted.config.num_layers,
        float_bytes=_folder_bytes(float_dir),
        int4_bytes=_folder_bytes(int4_dir),
        max_logit_diff=(
            max(check.prompt_max_abs, check.decode_max_abs) if check is not None else float("nan")
        ),
        prompt=prompt,
        float_text=ref.results[0].text,
        int4_text=got.results[0].text,
        top1_agreement=agreement.top1_agreement,
        tokens_per_s=got.to_dict()["tokens_per_s"] or 0.0,
        chat_answer=_served_chat(int4_dir, "Hello, who are you?"),
        notes=list(converted.notes) + list(quantized.notes),
    )


@dataclass(frozen=True)
class Step:
    name: str
    title: str
    run: Callable[[DemoState], object]


STEPS: list[Step] = [
    Step("build", "build and train the model (PyTorch, digits)", build),
    Step("convert", "convert PyTorch → ONNX, verified", convert),
    Step("inspect", "inspect the ONNX model", inspect_model),
    Step("optimize", "optimize (level 2) and verify", optimize),
    Step("quantize", "quantize to int8 (static, calibrated)", quantize),
    Step("latency", "latency under ONNX Runtime, before and after", latency),
    Step("evaluate", "accuracy on the digits test split", evaluate),
    Step("summary", "before and after", summary),
    Step(
        "protect", "protect: obfuscate and encrypt the int8 model, run it from the package", protect
    ),
    Step("advise", "what serves 2,000 requests/s at a 5 ms p99 (advisor)", advise),
    Step("transformer", "a transformer: optimize and dynamic int8", transformer),
    Step("decoder", "a decoder LLM: convert with its KV cache, int4, generate, serve", decoder),
]
