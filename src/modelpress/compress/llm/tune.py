"""End-to-end tuning of an int4 LLM's block scales against its float model (distillation).

The per-layer methods (``grid.py``, ``gptq.py``, ``awq.py``) each fit one weight to its own
output error; the errors they leave compound through the layers. Tuning looks at the whole
model: the quantized decoder runs as a torch module (``runtime.torch_backend``; its
``MatMulNBits`` and ``DequantizeLinear`` kernels dequantize from the scales as they are, so a
gradient reaches them), its integer codes stay as ``quantize_llm`` chose them, and every block
scale of every quantized MatMul is multiplied by a learned factor ``exp(a)`` (``a = 0`` at the
start; one per scale) to lower the KL divergence of its next-token distributions from the float
model's, ``KL(float || quantized)`` per token, on the calibration text. (The idea of
EfficientQAT's E2E-QP and PEQA: train the step sizes, keep the codes. No rounding is learned
here, so every code stays where it was, in range.)

The text is cut into windows of ``seq_len`` tokens; the even windows train (Adam, one window a
step, the learning rate decaying linearly to 0), the odd ones are held out. The float model's
log-probabilities are computed once (ONNX Runtime, float16 in memory). The tuned scales are
written back only if the held-out KL went down; otherwise the model is left as it was and the
report says so (``kept``). Embedding tables (``GatherBlockQuantized``, a ``DequantizeLinear``
feeding a ``Gather``) are not tuned.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import onnx_ir as ir

from modelpress.compress.llm.calibrate import text_windows
from modelpress.compress.llm.output import check_output, write_folder
from modelpress.errors import OptionError, require
from modelpress.ir import llm, load, nbits
from modelpress.ir.graph import (
    add_initializer,
    copy_model,
    remove_unused_initializers,
    swap_node,
)
from modelpress.ir.match import const_array
from modelpress.verify.llm import Decoder, read_text

# Adam's first steps move every log-factor by about the learning rate, and the change of the
# model's output adds up over all of them: the default rate is LR_SCALE / sqrt(scales). Measured:
# glassllm (26,784 scales) did best at 5e-3 of 2e-3, 5e-3, 1e-2 (2e-2 diverged); SmolLM2-135M
# (4.2 M scales) diverged on its first step at 2e-3 and 5e-3 and descends at 3e-4 (noisily):
# 0.5 gives 3e-3 and 2.4e-4.
LR_SCALE = 0.5


@dataclass
class TuneReport:
    """What tuning did: KL per token from the float model (nats), while training and on the
    held-out windows before and after."""

    steps: int
    train_windows: int
    held_out_windows: int
    seq_len: int
    learning_rate: float
    weights: int  # quantized MatMul weights whose scales were tuned
    scales: int  # block scales tuned
    loss_before: float  # mean loss of the first pass over the training windows
    loss_after: float  # of the last pass (each window's loss as its step found it)
    held_out_before: float  # mean KL per token on the held-out windows
    held_out_after: float
    kept: bool  # the tuned scales were written (the held-out KL went down)
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def check_tuning(steps: int, *, has_text: bool) -> None:
    if steps < 0:
        raise OptionError(f"`tune_steps` must be at least 0, got {steps}")
    if steps and not has_text:
        raise OptionError("`tune_steps` needs calibration text: give `data` (a text file)")


@dataclass
class _Weight:
    """One block-quantized MatMul weight ``W [K, N]``: ``W = (qz · s)ᵀ`` blockwise."""

    node: ir.Node  # its MatMulNBits, or the DequantizeLinear that feeds a MatMul
    scale: ir.Value  # the scales' initializer: [N·n_blocks] (MatMulNBits), [n_blocks, N] (DQ)
    k: int
    qz: np.ndarray  # [N, n_blocks, block_size] float32: codes minus zero points (K padded)
    s: np.ndarray  # [N, n_blocks] float32


def quantized_weights(model: ir.Model) -> list[_Weight]:
    """The block-quantized MatMul weights of ``model``: ``MatMulNBits`` nodes, and blocked
    ``DequantizeLinear`` nodes (axis 0) whose output only ``MatMul`` s read as ``B``."""
    out = []
    for node in model.graph:
        if node.op_type == "MatMulNBits" and node.domain == nbits.MS_DOMAIN:
            out.append(_from_nbits(node))
        elif (
            node.op_type == "DequantizeLinear"
            and node.attributes.get_int("block_size", 0) > 0
            and node.attributes.get_int("axis", 1) == 0
            and all(u.node.op_type == "MatMul" and u.idx == 1 for u in node.outputs[0].uses())
        ):
            out.append(_from_dq(node))
    return out


def _from_nbits(node: ir.Node) -> _Weight:
    a = node.attributes
    k, n, bits, bs = (a.get_int(x) for x in ("K", "N", "bits", "block_size"))
    nb = -(-k // bs)
    codes = nbits.unpack_codes(const_array(node.inputs[1]), bits, nb * bs).astype(np.float32)
    zp = node.inputs[3] if len(node.inputs) > 3 else None
    if zp is None:
        z = np.full((n, nb), 2 ** (bits - 1), np.float32)
    elif const_array(zp).dtype.kind == "f":
        z = const_array(zp).reshape(n, nb).astype(np.float32)
    else:
        z = nbits.unpack_zero_points(const_array(zp), bits, n, nb).astype(np.float32)
    qz = codes.reshape(n, nb, bs) - z[:, :, None]
    s = const_array(node.inputs[2]).reshape(n, nb).astype(np.float32)
    return _Weight(node, node.inputs[2], k, qz, s)


def _from_dq(node: ir.Node) -> _Weight:
    bs = node.attributes.get_int("block_size")
    codes = const_array(node.inputs[0]).astype(np.float32)  # [K, N]
    k, n = codes.shape
    nb = -(-k // bs)
    zp = node.inputs[2] if len(node.inputs) > 2 else None
    if zp is not None:
        codes = codes - np.repeat(const_array(zp).astype(np.float32), bs, axis=0)[:k]
    qz = np.zeros((n, nb * bs), np.float32)
    qz[:, :k] = codes.T
    s = const_array(node.inputs[1]).T.astype(np.float32)
    return _Weight(node, node.inputs[1], k, qz.reshape(n, nb, bs), s)


def _student_graph(model: ir.Model) -> tuple[ir.Model, list[str]]:
    """A copy of ``model`` whose quantized MatMul weights are float initializers (their names
    returned, in ``quantized_weights``' order): the student overrides them each step."""
    student = copy_model(model)
    graph, names = student.graph, []
    for w in quantized_weights(student):
        node = w.node
        dense = (w.qz * w.s[:, :, None]).reshape(len(w.s), -1)[:, : w.k].T
        value = add_initializer(graph, np.ascontiguousarray(dense), f"{node.name}.tuned")
        names.append(value.name)
        if node.op_type == "MatMulNBits":
            mm = ir.node("MatMul", [node.inputs[0], value], name=node.name)
            swap_node(graph, node, [mm], mm.outputs[0])
        else:
            for use in list(node.outputs[0].uses()):
                use.node.replace_input_with(use.idx, value)
            graph.remove(node, safe=True)
    remove_unused_initializers(graph)
    return student, names


@dataclass(frozen=True)
class TuneOptions:
    """How to tune: ``steps`` (one window each), windows of ``seq_len`` tokens, at most
    ``samples`` of them (even: training, odd: held out); ``learning_rate`` ``None``: ``LR_SCALE /
    sqrt(number of scales)``; ``threads`` for torch and ONNX Runtime."""

    steps: int
    seq_len: int = 512
    samples: int = 32
    learning_rate: float | None = None
    threads: int | None = None


def tune_model(
    model: ir.Model,
    folder: str | os.PathLike,
    text: str,
    options: TuneOptions,
    *,
    progress: Callable[[int, int, float], None] | None = None,
) -> TuneReport:
    """Tune the block scales of the quantized ``model`` (in place) against the float LLM folder
    ``folder`` on ``text`` (module docstring). ``progress(step, steps, loss)`` after each step."""
    require("torch", extra="torch", purpose="tuning an int4 LLM")
    import torch

    steps, threads, learning_rate = options.steps, options.threads, options.learning_rate

    start = time.perf_counter()
    check_tuning(steps, has_text=text is not None)
    teacher = Decoder.open(folder, threads=threads)
    windows = text_windows(teacher, text, seq_len=options.seq_len, samples=options.samples)
    train, held = windows[0::2], windows[1::2] or windows[:1]
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        student = _Student(model, teacher)
        targets = [student.target(ids) for ids in train]
        held_targets = [student.target(ids) for ids in held]
        held_before = student.kl(held, held_targets)
        scales = sum(w.s.size for w in student.weights)
        lr = learning_rate or LR_SCALE / np.sqrt(max(scales, 1))
        opt = torch.optim.Adam(student.factors, lr=lr)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 - i / max(steps, 1))
        losses = []
        for step in range(steps):
            i = step % len(train)
            loss = student.loss(train[i], targets[i])
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if progress:
                progress(step + 1, steps, losses[-1])
        held_after = student.kl(held, held_targets) if steps else held_before
        kept = steps > 0 and held_after < held_before
        if kept:
            student.write_back()
    finally:
        torch.set_num_threads(old_threads)
    return TuneReport(
        steps,
        len(train),
        len(held) if len(windows) > 1 else 0,
        int(len(windows[0])),
        float(lr),
        len(student.weights),
        scales,
        _mean(losses[: len(train)]),
        _mean(losses[-len(train) :]),
        held_before,
        held_after,
        kept,
        time.perf_counter() - start,
    )


class _Student:
    """The quantized model as a torch module, each quantized weight ``(qz · base · exp(a))ᵀ``."""

    def __init__(self, model: ir.Model, teacher: Decoder):
        import torch

        from modelpress.runtime.torch_backend import to_torch

        self.torch = torch
        self.teacher = teacher
        self.weights = quantized_weights(model)
        student, names = _student_graph(model)
        self.module = to_torch(student)
        self.module.requires_grad_(False)
        self.logits_at = self.module.output_names.index(llm.LOGITS)
        self.attrs = [self.module.onnx_names[n] for n in names]
        self.qz = [torch.from_numpy(w.qz) for w in self.weights]
        self.base = [torch.from_numpy(w.s) for w in self.weights]
        self.factors = [torch.zeros_like(b, requires_grad=True) for b in self.base]

    def scales(self) -> list:
        return [b * self.torch.exp(f) for b, f in zip(self.base, self.factors)]

    def dense(self) -> dict:
        out = {}
        for attr, w, qz, s in zip(self.attrs, self.weights, self.qz, self.scales()):
            out[attr] = (qz * s[:, :, None]).reshape(len(s), -1)[:, : w.k].T
        return out

    def target(self, ids: np.ndarray):
        """The float model's log-probabilities of the window ``ids`` (float16: memory)."""
        (logits,) = self.teacher.session.run([llm.LOGITS], self.teacher.feeds(ids[None]))
        t = self.torch.from_numpy(logits[0].astype(np.float32))
        return self.torch.log_softmax(t, dim=-1).to(self.torch.float16)

    def loss(self, ids: np.ndarray, target):
        """Mean ``KL(float || quantized)`` per token of one window."""
        torch = self.torch
        feeds = {k: torch.from_numpy(v) for k, v in self.teacher.feeds(ids[None]).items()}
        out = torch.func.functional_call(self.module, self.dense(), args=(), kwargs=feeds)
        logits = out[self.logits_at] if isinstance(out, tuple) else out
        log_q = torch.log_softmax(logits[0].to(torch.float32), dim=-1)
        log_p = target.to(torch.float32)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    def kl(self, windows: list[np.ndarray], targets: list) -> float:
        with self.torch.no_grad():
            total = sum(float(self.loss(w, t)) * len(w) for w, t in zip(windows, targets))
        return total / max(sum(len(w) for w in windows), 1)

    def write_back(self) -> None:
        """The tuned scales into the quantized model's initializers, in their layouts."""
        with self.torch.no_grad():
            for w, s in zip(self.weights, self.scales()):
                s = s.numpy().astype(np.float32)
                array = s.reshape(-1) if w.node.op_type == "MatMulNBits" else s.T
                w.scale.const_value = ir.tensor(np.ascontiguousarray(array), name=w.scale.name)


def tune_llm(
    folder: str | os.PathLike,
    quantized: str | os.PathLike,
    output: str | os.PathLike,
    *,
    data: str | os.PathLike,
    options: TuneOptions,
    progress: Callable[[int, int, float], None] | None = None,
) -> TuneReport:
    """Tune the quantized LLM folder ``quantized`` (made from the float folder ``folder``) on
    the text file ``data`` and write it to ``output`` (``quantize_llm(..., tune_steps=N)`` does
    this as it quantizes)."""
    src, out = Path(quantized), Path(output)
    config = llm.read_config(src)
    check_output(out, src)
    text = read_text(data)
    model = load(src / llm.MODEL_FILE)
    report = tune_model(model, folder, text, options, progress=progress)
    quantization = {**config.quantization, "tuning": record(report)}
    write_folder(src, out, model, replace(config, quantization=quantization))
    return report


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


def record(report: TuneReport) -> dict:
    """What the folder's config keeps of a tuning."""
    keys = ("steps", "kept", "loss_before", "loss_after", "held_out_before", "held_out_after")
    return {k: getattr(report, k) for k in keys}
