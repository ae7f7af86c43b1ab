"""Built-in workloads by name, built from their architecture alone (no weights, no downloads).

- ``resnet50``: torchvision ResNet-50 v1.5 (stride on the 3×3 convolution), 224² input:
  4.09 GMACs (≈ 8.2 GFLOPs), 25.56 M parameters.
- ``mobilenet-v2``: Sandler et al. 2018, width 1.0, 224²: 0.30 GMACs, 3.50 M parameters.
- ``bert-base`` / ``bert-large``: Devlin et al. 2019 encoders (12×768 / 24×1024, vocabulary
  30522, 512 positions): 110 M / 335 M parameters; default sequence 128 / 384.
- ``gpt-j-6b``, ``llama-2-7b``, ``llama-2-70b``: decoder LLMs from their published config numbers
  (see ``profile.llm``): 6.05 B, 6.74 B and 68.98 B parameters.

A builder takes the sequence length (``None``: the workload's default) and the tokens to generate.

Padding-free encoder inference (``avg_seq``): engines with variable-length kernels (TensorRT's
varseqlen BERT, FasterTransformer/"remove padding", packed MLPerf submissions) concatenate the
real tokens of a batch and never compute on padding. The encoder is then built at ``avg_seq``
tokens per sequence: every matrix product, norm and activation scales with the real token count
L̄, and the attention products with L̄² per sequence, which slightly underestimates Σ Lᵢ² (by
Var(L)/L̄²: a dataset with spread-out lengths does a little more attention work). Throughput stays
counted in sequences. ``seq`` remains the padded maximum (checked against the positions).

Default: padded. The built-in ``bert-base``/``bert-large`` run every sequence at ``seq`` unless
``avg_seq`` is given, because that is what a plain fixed-shape deployment (ONNX Runtime,
PyTorch, TensorRT without the varseqlen plugins) does, and the mean real length is a property of
the user's data that the advisor cannot know: a benchmark's mean (e.g. SQuAD in MLPerf BERT)
belongs on the command line (``--avg-seq``) when comparing with a padding-free result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from modelpress.errors import OptionError
from modelpress.profile.llm import LLMConfig, llm_workload
from modelpress.profile.workload import Kernel, Workload


class _Net:
    """Accumulates kernels of a CNN while tracking the activation shape (C, H, W)."""

    def __init__(self, channels: int, size: int):
        self.c, self.h, self.w = channels, size, size
        self.kernels: list[Kernel] = []

    def _add(self, name, kind, flops, weights, in_elems, out_elems, fusable=False, out_cols=0.0):
        self.kernels.append(
            Kernel(
                name,
                kind,
                float(flops),
                float(weights),
                float(in_elems),
                float(out_elems),
                fusable,
                float(out_cols),
            )
        )

    def conv(self, name: str, out: int, k: int, stride: int = 1, groups: int = 1) -> None:
        pad = k // 2
        h = (self.h + 2 * pad - k) // stride + 1
        w = (self.w + 2 * pad - k) // stride + 1
        in_elems = self.c * self.h * self.w
        macs = out * h * w * (self.c // groups) * k * k
        # implicit GEMM: (batch·H·W) × out output matrix
        self._add(
            name,
            "conv",
            2 * macs,
            out * (self.c // groups) * k * k,
            in_elems,
            out * h * w,
            out_cols=out,
        )
        self.c, self.h, self.w = out, h, w

    def pointwise(self, name: str, op: str, flops_per_elem: float = 1.0, reads: int = 1) -> None:
        """BatchNorm (folded at inference), activations, residual adds: elementwise on (C, H, W)."""
        n = self.c * self.h * self.w
        weights = 2 * self.c if op == "norm" else 0  # BN scale and shift
        self._add(
            name,
            "norm" if op == "norm" else "elementwise",
            flops_per_elem * n,
            weights,
            reads * n,
            n,
            True,
        )

    def pool(self, name: str, k: int, stride: int) -> None:
        h = (self.h + 2 * (k // 2) - k) // stride + 1
        w = (self.w + 2 * (k // 2) - k) // stride + 1
        self._add(
            name, "reduce", self.c * h * w * k * k, 0, self.c * self.h * self.w, self.c * h * w
        )
        self.h, self.w = h, w

    def head(self, classes: int) -> None:
        self._add(
            "global_pool", "reduce", self.c * self.h * self.w, 0, self.c * self.h * self.w, self.c
        )
        self.kernels.append(_dense("fc", 1, self.c, classes))

    def conv_bn(
        self, name: str, out: int, k: int, stride: int = 1, groups: int = 1, act: bool = True
    ) -> None:
        self.conv(name, out, k, stride, groups)
        self.pointwise(name + ".bn", "norm", 2.0)
        if act:
            self.pointwise(name + ".act", "elementwise")


def resnet50(seq: int | None = None, gen_tokens: int = 0) -> Workload:
    net = _Net(3, 224)
    net.conv_bn("conv1", 64, 7, 2)
    net.pool("maxpool", 3, 2)
    for stage, (width, blocks) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=1):
        for b in range(blocks):
            stride = 2 if b == 0 and stage > 1 else 1
            c_in, h_in, w_in = net.c, net.h, net.w
            p = f"layer{stage}.{b}"
            net.conv_bn(p + ".conv1", width, 1)
            net.conv_bn(p + ".conv2", width, 3, stride)
            net.conv_bn(p + ".conv3", width * 4, 1, act=False)
            if b == 0:  # projection shortcut, computed from the block's input
                main = (net.c, net.h, net.w)
                net.c, net.h, net.w = c_in, h_in, w_in
                net.conv_bn(p + ".downsample", width * 4, 1, stride, act=False)
                net.c, net.h, net.w = main
            net.pointwise(p + ".add", "elementwise", 1.0, reads=2)
            net.pointwise(p + ".relu", "elementwise")
    net.head(1000)
    return Workload("resnet50", tuple(net.kernels), _params(net.kernels), "image 3x224x224")


def mobilenet_v2(seq: int | None = None, gen_tokens: int = 0) -> Workload:
    net = _Net(3, 224)
    net.conv_bn("features.0", 32, 3, 2)
    block = 0
    for t, c, n, s in (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    ):
        for i in range(n):
            block += 1
            p = f"features.{block}"
            c_in = net.c
            stride = s if i == 0 else 1
            if t != 1:
                net.conv_bn(p + ".expand", c_in * t, 1)
            net.conv_bn(p + ".depthwise", net.c, 3, stride, groups=net.c)
            net.conv_bn(p + ".project", c, 1, act=False)
            if stride == 1 and c_in == c:
                net.pointwise(p + ".add", "elementwise", 1.0, reads=2)
    net.conv_bn("features.18", 1280, 1)
    net.head(1000)
    return Workload("mobilenet-v2", tuple(net.kernels), _params(net.kernels), "image 3x224x224")


@dataclass(frozen=True)
class _Encoder:
    name: str
    layers: int
    hidden: int
    heads: int
    vocab: int = 30522
    positions: int = 512
    default_seq: int = 128


def _dense(name: str, rows: float, n_in: int, n_out: int) -> Kernel:
    """A linear layer with bias on ``rows`` tokens: ``n_in`` features in, ``n_out`` out."""
    flops = 2.0 * rows * n_in * n_out + rows * n_out
    weights, reads, writes = n_in * n_out + n_out, rows * n_in, rows * n_out
    return Kernel(
        name, "matmul", flops, float(weights), float(reads), float(writes), False, float(n_out)
    )


def _encoder(cfg: _Encoder, seq: int | None, avg_seq: float | None = None) -> Workload:
    padded = seq or cfg.default_seq
    if padded > cfg.positions:
        raise OptionError(f"`seq` {padded}: {cfg.name} has {cfg.positions} positions")
    if avg_seq is not None and not 1 <= avg_seq <= padded:
        raise OptionError(f"`avg_seq` {avg_seq:g}: must be between 1 and the sequence {padded}")
    # padding-free: the kernels see only the real tokens (see the module docstring)
    s: float = padded if avg_seq is None else float(avg_seq)
    h, i = cfg.hidden, 4 * cfg.hidden
    hd = h // cfg.heads  # per-head width: each head's context product is s × hd
    k: list[Kernel] = [
        Kernel("embeddings", "memory", 0.0, (cfg.vocab + cfg.positions + 2) * h, 3 * s, s * h),
        Kernel("embeddings.norm", "norm", 8.0 * s * h, 2 * h, 3 * s * h, s * h),
    ]
    scores = cfg.heads * s * s
    for n in range(cfg.layers):
        p = f"layer{n}"
        k += [
            _dense(p + ".qkv", s, h, 3 * h),
            # unfused attention, as in the reference implementations: scores and probabilities
            # are materialised (B·heads·s² each), softmax and dropout run as separate kernels
            Kernel(p + ".scores", "matmul", 2.0 * s * s * h, 0, 2 * s * h, scores, out_cols=s),
            Kernel(p + ".softmax", "reduce", 5.0 * scores, 0, scores, scores, True),
            Kernel(
                p + ".context", "matmul", 2.0 * s * s * h, 0, scores + s * h, s * h, out_cols=hd
            ),
            _dense(p + ".out", s, h, h),
            Kernel(p + ".add_norm1", "norm", 9.0 * s * h, 2 * h, 2 * s * h, s * h),
            _dense(p + ".ffn_in", s, h, i),
            Kernel(p + ".gelu", "elementwise", 8.0 * s * i, 0, s * i, s * i, True),
            _dense(p + ".ffn_out", s, i, h),
            Kernel(p + ".add_norm2", "norm", 9.0 * s * h, 2 * h, 2 * s * h, s * h),
        ]
    # pooler (dense on [CLS]) as in BertModel; the task head is a few thousand FLOPs more
    k.append(Kernel("pooler", "matmul", 2.0 * h * h, h * h + h, h, h, out_cols=h))
    sample = (
        f"sequence of {padded} tokens"
        if avg_seq is None
        else f"sequence of up to {padded} tokens, {avg_seq:g} on average (padding-free)"
    )
    return Workload(cfg.name, tuple(k), _params(k), sample, tokens_per_sample=max(1, round(s)))


_LLMS = {
    "gpt-j-6b": LLMConfig("gpt-j-6b", 28, 4096, 16, 16, 16384, 50400, 2048, gated_mlp=False),
    "llama-2-7b": LLMConfig("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, gated_mlp=True),
    "llama-2-70b": LLMConfig("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, gated_mlp=True),
}


def _params(kernels) -> float:
    return float(sum(k.weight_elems for k in kernels))


def _llm(name: str) -> Callable[[int | None, int], Workload]:
    def build(seq: int | None = None, gen_tokens: int = 128) -> Workload:
        return llm_workload(_LLMS[name], seq=seq or 1024, gen_tokens=gen_tokens)

    return build


_ENCODERS = {
    "bert-base": _Encoder("bert-base", 12, 768, 12),
    "bert-large": _Encoder("bert-large", 24, 1024, 16, default_seq=384),
}


def _enc(name: str) -> Callable[..., Workload]:
    def build(seq: int | None = None, gen_tokens: int = 0, avg_seq: float | None = None):
        return _encoder(_ENCODERS[name], seq, avg_seq)

    return build


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "resnet50": resnet50,
    "mobilenet-v2": mobilenet_v2,
    **{name: _enc(name) for name in _ENCODERS},
    **{name: _llm(name) for name in _LLMS},
}


def llm_config(name: str) -> LLMConfig | None:
    return _LLMS.get(name)


def get_workload(
    name: str, *, seq: int | None = None, gen_tokens: int = 128, avg_seq: float | None = None
) -> Workload:
    """A built-in workload; ``avg_seq`` (encoders only) is the mean real sequence length for
    padding-free execution (default: padded to ``seq``)."""
    key = name.strip().lower().replace("_", "-")
    key = {
        "resnet-50": "resnet50",
        "mobilenetv2": "mobilenet-v2",
        "gptj": "gpt-j-6b",
        "gpt-j": "gpt-j-6b",
    }.get(key, key)
    if key not in WORKLOADS:
        raise OptionError(f"`workload` {name!r}: unknown; choose one of {', '.join(WORKLOADS)}")
    if avg_seq is not None:
        if key not in _ENCODERS:
            raise OptionError(
                f"`avg_seq`: applies to encoder workloads ({', '.join(_ENCODERS)}), not {key}"
            )
        return WORKLOADS[key](seq, gen_tokens, avg_seq)
    return WORKLOADS[key](seq, gen_tokens)


__all__ = ["WORKLOADS", "get_workload", "llm_config", "mobilenet_v2", "resnet50"]
