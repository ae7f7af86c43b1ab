"""Quantization on architectures modelpress has never seen (none of them is in modelpress.zoo).

Each model is written here in PyTorch, converted with ``modelpress.convert`` (the dynamo exporter,
or the TorchScript one where it falls back) and quantized with ``modelpress.compress.quantize`` at
its DEFAULT options: the CNNs with ``mode="static"`` (64 calibration images in batches of 16),
the transformers with ``mode="dynamic"`` (4 calibration batches of 8 sequences).

CNNs (trained here for a few seconds on a learnable synthetic task, so accuracy means something):
vgg (plain conv stack, MaxPool, Flatten + 2 Linear), effnet (inverted residuals, depthwise conv,
SiLU, squeeze-excite), dense-inception (Inception branches with Concat, DenseNet blocks with
pre-activation BatchNorm, AvgPool transitions), unet (per-pixel segmentation, ConvTranspose and
bilinear Resize upsampling, skip Concat), resnet-gn (GroupNorm, GELU, LeakyReLU, ELU). The
classifiers learn scikit-learn's digits at 3x64x64 (``bench_quantize.resnet18_data``); the U-Net
learns to mark bright shapes among dim ones.
Transformers (seeded random weights): gpt (causal decoder, mask from torch.triu + masked_fill
-inf, tied embedding / LM head), vit (patch-embedding Conv, class token, scaled_dot_product_attention,
no mask), torch-encoder (nn.TransformerEncoder with src_key_padding_mask).

Metrics, on held-out inputs, ONNX Runtime with all optimizations: top-1 accuracy (float32 and
int8, drop in points) and top-1 agreement for the classifiers; IoU with the true mask, pixel
agreement and IoU of the int8 mask with the float one for the U-Net; mean cosine similarity of
the per-sample flattened outputs (padding positions zeroed) and the largest relative error
(max |int8 - float| / max |float| per sample) for the transformers. Also: size ratio, quantize
seconds, latency at batch 1 and 8 (interleaved, one global thread pool, median and p25-p75, via
``bench_quantize.latency``), whether the int8 file loads with ``modelpress.load`` (onnx checker)
and runs under ``modelpress.verify``, and the notes ``quantize`` returned. A failure at any stage
becomes a row of the table.

    .venv/bin/python benchmarks/bench_quantize_unseen.py [--quick] [--models vgg gpt ...]

Writes benchmarks/results/quantize_unseen.md (raw numbers in benchmarks/_work/quantize_unseen/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import bench_quantize
import numpy as np
from bench_quantize import latency, resnet18_data, session, size

ROOT = Path(__file__).resolve().parent
WORK = ROOT / "_work" / "quantize_unseen"
RESULTS = ROOT / "results"
# bench_quantize.latency writes its timing spec under its module's WORK: point it at ours, so a
# run of bench_quantize.py at the same time cannot overwrite it.
bench_quantize.WORK = WORK

ACCURACY_DROP_LIMIT = 0.3  # points of top-1 accuracy (or of IoU for the U-Net)
COSINE_LIMIT = 0.995


@dataclass
class Case:
    """A trained (or seeded) PyTorch model with the data to convert, calibrate, score and time it."""

    name: str
    family: str  # "classifier" | "segmentation" | "transformer"
    description: str
    module: object
    example: tuple  # example inputs for the exporter
    dynamic: dict[str, tuple[int, ...]]
    calib: list[dict[str, np.ndarray]]
    evals: list[dict[str, np.ndarray]]  # held-out batches
    timing: dict[int, dict[str, np.ndarray]]  # batch size -> feeds
    truth: np.ndarray | None = None  # labels or masks for the held-out batches
    train_seconds: float = 0.0


@dataclass
class Row:
    case: str
    family: str
    description: str = ""
    stage: str = "build"
    exporter: str = ""
    metrics: dict = field(default_factory=dict)
    size_ratio: float | None = None
    quantize_seconds: float | None = None
    latency: dict = field(default_factory=dict)
    check: str = ""
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    rounding: dict = field(default_factory=dict)  # CNNs: output SQNR (dB) by rounding variant


# ---------------------------------------------------------------- CNNs


def _torch():
    import torch

    return torch


def build_vgg():
    from torch import nn

    layers, cin = [], 3
    for c in (32, "M", 64, "M", 128, "M", 128, "M"):
        if c == "M":
            layers.append(nn.MaxPool2d(2))
        else:
            layers += [nn.Conv2d(cin, c, 3, padding=1), nn.ReLU()]
            cin = c
    head = [
        nn.Flatten(),
        nn.Linear(128 * 4 * 4, 128),
        nn.ReLU(),
        nn.Dropout(0.2),
        nn.Linear(128, 10),
    ]
    return nn.Sequential(*layers, *head)


def build_effnet():
    torch = _torch()
    from torch import nn

    class SqueezeExcite(nn.Module):
        def __init__(self, c: int, r: int):
            super().__init__()
            self.reduce, self.expand = nn.Conv2d(c, r, 1), nn.Conv2d(r, c, 1)

        def forward(self, x):
            s = x.mean((2, 3), keepdim=True)
            return x * torch.sigmoid(self.expand(nn.functional.silu(self.reduce(s))))

    class MBConv(nn.Module):
        def __init__(self, cin: int, cout: int, expand: int, stride: int, k: int = 3):
            super().__init__()
            mid = cin * expand
            self.expand = (
                nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
                if expand > 1
                else nn.Identity()
            )
            self.dw = nn.Sequential(
                nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                nn.BatchNorm2d(mid),
                nn.SiLU(),
            )
            self.se = SqueezeExcite(mid, max(4, cin // 4))
            self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.residual = stride == 1 and cin == cout

        def forward(self, x):
            y = self.project(self.se(self.dw(self.expand(x))))
            return x + y if self.residual else y

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1, bias=False),
        nn.BatchNorm2d(16),
        nn.SiLU(),
        MBConv(16, 16, 1, 1),
        MBConv(16, 24, 4, 2),
        MBConv(24, 24, 4, 1),
        MBConv(24, 40, 4, 2, k=5),
        MBConv(40, 40, 4, 1, k=5),
        nn.Conv2d(40, 128, 1, bias=False),
        nn.BatchNorm2d(128),
        nn.SiLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.1),
        nn.Linear(128, 10),
    )


def build_dense_inception():
    torch = _torch()
    from torch import nn

    def bn_relu_conv(cin, cout, k):
        return nn.Sequential(
            nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, k, padding=k // 2)
        )

    class Inception(nn.Module):
        def __init__(self, cin: int):
            super().__init__()
            self.b1 = nn.Conv2d(cin, 16, 1)
            self.b3 = nn.Sequential(
                nn.Conv2d(cin, 16, 1), nn.ReLU(), nn.Conv2d(16, 24, 3, padding=1)
            )
            self.b5 = nn.Sequential(nn.Conv2d(cin, 8, 1), nn.ReLU(), nn.Conv2d(8, 8, 5, padding=2))
            self.pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), nn.Conv2d(cin, 8, 1))

        def forward(self, x):
            return torch.relu(torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1))

    class DenseLayer(nn.Module):
        def __init__(self, cin: int, growth: int):
            super().__init__()
            self.f = nn.Sequential(
                bn_relu_conv(cin, 4 * growth, 1), bn_relu_conv(4 * growth, growth, 3)
            )

        def forward(self, x):
            return torch.cat([x, self.f(x)], 1)

    def transition(cin, cout):
        return nn.Sequential(bn_relu_conv(cin, cout, 1), nn.AvgPool2d(2))

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        Inception(32),  # 56 channels at 32x32
        transition(56, 48),
        DenseLayer(48, 16),
        DenseLayer(64, 16),
        DenseLayer(80, 16),
        transition(96, 64),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )


def build_resnet_gn():
    from torch import nn

    class Block(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.n1 = nn.GroupNorm(8, cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.n2 = nn.GroupNorm(8, cout)
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(8, cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            y = nn.functional.leaky_relu(self.n1(self.c1(x)), 0.1)
            return nn.functional.elu(self.n2(self.c2(y)) + self.down(x))

    return nn.Sequential(
        nn.Conv2d(3, 32, 3, 2, 1, bias=False),
        nn.GroupNorm(8, 32),
        nn.GELU(),
        Block(32, 32, 1),
        Block(32, 64, 2),
        Block(64, 128, 2),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def build_unet():
    torch = _torch()
    from torch import nn

    def double(cin, cout):
        return nn.Sequential(
            nn.Conv2d(cin, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
            nn.Conv2d(cout, cout, 3, padding=1, bias=False),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        )

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.e1, self.e2, self.mid = double(3, 16), double(16, 32), double(32, 64)
            self.up1 = nn.ConvTranspose2d(64, 32, 2, stride=2)
            self.d1 = double(64, 32)
            self.up2 = nn.Sequential(
                nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                nn.Conv2d(32, 16, 1),
            )
            self.d2 = double(32, 16)
            self.out = nn.Conv2d(16, 1, 1)

        def forward(self, image):
            a = self.e1(image)
            b = self.e2(nn.functional.max_pool2d(a, 2))
            m = self.mid(nn.functional.max_pool2d(b, 2))
            y = self.d1(torch.cat([self.up1(m), b], 1))
            y = self.d2(torch.cat([self.up2(y), a], 1))
            return self.out(y)  # per-pixel logit of "bright shape"

    return UNet()


def shapes_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """3x64x64 images of 1-3 bright shapes (the mask) and 1-2 dim ones (distractors) on a noisy,
    tinted background: ``(images, masks)``, masks ``(n, 1, 64, 64)`` of 0/1."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:64, :64]
    images = rng.normal(0, 0.25, (n, 3, 64, 64)) + rng.normal(0, 0.3, (n, 3, 1, 1))
    masks = np.zeros((n, 1, 64, 64), dtype=np.float32)

    def shape() -> np.ndarray:
        cy, cx, r = rng.uniform(8, 56), rng.uniform(8, 56), rng.uniform(4, 12)
        if rng.random() < 0.5:
            return (yy - cy) ** 2 + (xx - cx) ** 2 < r * r
        return (np.abs(yy - cy) < r) & (np.abs(xx - cx) < rng.uniform(0.4, 1.0) * r)

    for i in range(n):
        for bright in [True] * rng.integers(1, 4) + [False] * rng.integers(1, 3):
            s = shape()
            level = rng.uniform(1.5, 2.5) if bright else rng.uniform(0.4, 0.8)
            images[i][:, s] += level * rng.uniform(0.7, 1.0, (3, 1))
            if bright:
                masks[i, 0][s] = 1.0
    return images.astype(np.float32), masks


def train(
    net, x: np.ndarray, y: np.ndarray, loss_fn, steps: int, lr: float, batch: int = 32
) -> None:
    """Adam with a one-cycle schedule on random mini-batches; seeded, so the run is repeatable."""
    torch = _torch()
    gen = torch.Generator().manual_seed(0)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
    net.train()
    for _ in range(steps):
        idx = torch.randint(0, len(xt), (batch,), generator=gen)
        loss = loss_fn(net(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    net.eval()


def one_thread(fn, *args):
    """Run ``fn`` on one torch thread: on a shared 2-core machine, two spinning OpenMP threads
    made training 3-7x slower than one (measured here)."""
    torch = _torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def fit_head(net, x: np.ndarray, y: np.ndarray) -> None:
    """Refit the final Linear of a briefly trained classifier as a logistic-regression probe on
    its penultimate features (as ``bench_quantize.build_resnet18`` does): a few seconds instead of
    the epochs end-to-end training would need here, and the held-out accuracy becomes high enough
    for a drop of a few tenths of a point to be visible."""
    torch = _torch()
    from sklearn.linear_model import LogisticRegression

    with torch.no_grad():
        feats = torch.cat([net[:-1](torch.from_numpy(x[i : i + 64])) for i in range(0, len(x), 64)])
    feats = feats.numpy().astype(np.float64)
    # one scale for all features: per-feature scaling would amplify near-constant ones
    mean, std = feats.mean(0), feats.std()
    probe = LogisticRegression(max_iter=3000, C=100.0).fit((feats - mean) / std, y)
    w = probe.coef_ / std
    net[-1].weight.data = torch.from_numpy(w.astype(np.float32))
    net[-1].bias.data = torch.from_numpy((probe.intercept_ - w @ mean).astype(np.float32))


def batches(x: np.ndarray, n: int, key: str = "image") -> list[dict[str, np.ndarray]]:
    return [{key: x[i : i + n]} for i in range(0, len(x), n)]


# End-to-end Adam steps (batch 32, 16 for the U-Net): 10-20 s each on one contended core.
CNN_STEPS = {"vgg": 25, "effnet": 40, "dense-inception": 30, "resnet-gn": 40, "unet": 40}


def ImageInput(net):  # noqa: N802 - a class made on demand, so torch is imported lazily
    """``net`` with its input named ``image`` (nn.Sequential's is ``input``)."""
    from torch import nn

    class Wrapped(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, image):
            return self.net(image)

    return Wrapped()


CNN_BUILDERS = {
    "vgg": (build_vgg, "VGG-style: 4 conv+ReLU, 4 MaxPool, Flatten, 2 Linear (51 MMAC)"),
    "effnet": (build_effnet, "EfficientNet-like: MBConv, depthwise 3x3/5x5, SiLU, squeeze-excite"),
    "dense-inception": (
        build_dense_inception,
        "Inception block (4 branches, Concat) + DenseNet layers (BN-ReLU-Conv, Concat), AvgPool",
    ),
    "resnet-gn": (build_resnet_gn, "ResNet-style: GroupNorm, GELU stem, LeakyReLU, ELU"),
    "unet": (
        build_unet,
        "U-Net: 3 levels, ConvTranspose + bilinear Resize, skip Concat, 1x64x64 logits",
    ),
}


def cnn_case(name: str, quick: bool) -> Case:
    torch = _torch()
    from torch import nn

    from modelpress import zoo

    build, description = CNN_BUILDERS[name]
    torch.manual_seed(0)
    net = build()
    steps = CNN_STEPS[name] // (3 if quick else 1)
    t0 = time.perf_counter()
    if name == "unet":
        x, m = shapes_data(640, seed=0)
        one_thread(
            train, net, x, m, nn.functional.binary_cross_entropy_with_logits, steps, 3e-3, 16
        )
        test, truth = shapes_data(64 if quick else 160, seed=2)
        cal = shapes_data(64, seed=1)[0]
        family = "segmentation"
    else:
        d = zoo.digits_data()
        x = resnet18_data(d.x_train, len(d.x_train), seed=0)
        one_thread(train, net, x, d.y_train, nn.functional.cross_entropy, steps, 3e-3)
        one_thread(fit_head, net, x[:640], d.y_train[:640])
        test = resnet18_data(d.x_test, 128 if quick else len(d.x_test), seed=2)
        truth = d.y_test[: len(test)]
        cal = resnet18_data(d.x_train, 64, seed=1)
        family = "classifier"
    return Case(
        name=name,
        family=family,
        description=description,
        module=net if name == "unet" else ImageInput(net),
        example=(torch.from_numpy(test[:2]),),
        dynamic={"image": (0,)},
        calib=batches(cal, 16),
        evals=batches(test, 32),
        timing={1: {"image": test[:1]}, 8: {"image": test[:8]}},
        truth=truth,
        train_seconds=time.perf_counter() - t0,
    )


# ---------------------------------------------------------------- transformers

VOCAB, MAX_POS, EVAL_SEQ, TIME_SEQ = 2048, 128, 64, 128


def _init_gpt_weights(module) -> None:
    from torch import nn

    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if getattr(m, "bias", None) is not None:
                nn.init.zeros_(m.bias)


def build_gpt(d: int = 256, heads: int = 4, layers: int = 4):
    torch = _torch()
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = (
                z.view(b, t, heads, c // heads).transpose(1, 2) for z in self.qkv(x).split(c, dim=2)
            )
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
            att = att.masked_fill(causal, float("-inf")).softmax(-1)
            return self.proj((att @ v).transpose(1, 2).reshape(b, t, c))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.attn, self.ln2 = nn.LayerNorm(d), Attention(), nn.LayerNorm(d)
            self.mlp = nn.Sequential(
                nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d)
            )

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, d), nn.Embedding(MAX_POS, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d)
            self.lm_head = nn.Linear(d, VOCAB, bias=False)
            _init_gpt_weights(self)
            self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

        def forward(self, input_ids):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            return self.lm_head(self.ln_f(self.blocks(self.wte(input_ids) + self.wpe(pos))))

    return GPT()


def build_vit(d: int = 192, heads: int = 3, layers: int = 4, patch: int = 8):
    torch = _torch()
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.qkv, self.proj = nn.LayerNorm(d), nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
            a = nn.functional.scaled_dot_product_attention(q, k, v)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            tokens = (64 // patch) ** 2 + 1
            self.patch = nn.Conv2d(3, d, patch, patch)
            self.cls = nn.Parameter(torch.randn(1, 1, d) * 0.02)
            self.pos = nn.Parameter(torch.randn(1, tokens, d) * 0.02)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.norm = nn.LayerNorm(d)

        def forward(self, image):
            x = self.patch(image).flatten(2).transpose(1, 2)
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
            return self.norm(self.blocks(x))  # last hidden state, (batch, 65, d)

    return ViT()


def build_torch_encoder(d: int = 256, heads: int = 4, layers: int = 4):
    torch = _torch()
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.pos = nn.Embedding(VOCAB, d), nn.Embedding(MAX_POS, d)
            layer = nn.TransformerEncoderLayer(
                d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True
            )
            self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

        def forward(self, input_ids, attention_mask):
            pos = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.emb(input_ids) + self.pos(pos)
            return self.enc(x, src_key_padding_mask=attention_mask == 0)

    return Encoder()


def token_feeds(n: int, seq: int, seed: int, padded: bool) -> dict[str, np.ndarray]:
    """Token ids drawn from a Zipf-like distribution (frequent tokens repeat, as in text); with
    ``padded``, each row keeps a random length in [seq/4, seq] and is padded (id 0, mask 0) after."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, VOCAB)
    ids = rng.choice(np.arange(1, VOCAB), size=(n, seq), p=p / p.sum()).astype(np.int64)
    if not padded:
        return {"input_ids": ids}
    lengths = rng.integers(max(1, seq // 4), seq + 1, n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int64)
    return {"input_ids": ids * mask, "attention_mask": mask}


def split(feeds: dict[str, np.ndarray], n: int) -> list[dict[str, np.ndarray]]:
    total = len(next(iter(feeds.values())))
    return [{k: v[i : i + n] for k, v in feeds.items()} for i in range(0, total, n)]


TRANSFORMERS = {
    "gpt": "GPT-2-style decoder: 4 layers, d=256, causal mask (triu + masked_fill -inf), tied LM head, logits",
    "vit": "ViT: 8x8 patches of 3x64x64, class token, 4 layers, d=192, SDPA, last hidden state",
    "torch-encoder": "nn.TransformerEncoder (4 layers, d=256, post-LN, GELU) with src_key_padding_mask",
}


def transformer_case(name: str, quick: bool) -> Case:
    torch = _torch()

    torch.manual_seed(0)
    n_eval = 16 if quick else 64
    if name == "vit":
        module = build_vit()
        # digits at 64x64 give the patches real structure; random weights take it from there
        from modelpress import zoo

        d = zoo.digits_data()
        test = resnet18_data(d.x_test, n_eval, seed=2)
        cal = resnet18_data(d.x_train, 32, seed=1)
        evals, calib = batches(test, 8), batches(cal, 8)
        timing = {1: {"image": test[:1]}, 8: {"image": test[:8]}}
        dynamic = {"image": (0,)}
    else:
        padded = name == "torch-encoder"
        module = build_gpt() if name == "gpt" else build_torch_encoder()
        evals = split(token_feeds(n_eval, EVAL_SEQ, seed=2, padded=padded), 8)
        calib = split(token_feeds(32, EVAL_SEQ, seed=1, padded=padded), 8)
        timing = {b: token_feeds(b, TIME_SEQ, seed=3, padded=padded) for b in (1, 8)}
        dynamic = {k: (0, 1) for k in evals[0]}
    module.eval()
    example = tuple(torch.from_numpy(v[:2]) for v in evals[0].values())
    return Case(
        name, "transformer", TRANSFORMERS[name], module, example, dynamic, calib, evals, timing
    )


# ---------------------------------------------------------------- metrics


def outputs(path: Path, feeds_list: list[dict]) -> np.ndarray:
    """The first output over all batches, concatenated (ONNX Runtime, all optimizations)."""
    s = session(path)
    return np.concatenate([s.run(None, f)[0] for f in feeds_list])


def classifier_metrics(ref: np.ndarray, got: np.ndarray, labels: np.ndarray) -> dict:
    acc_f, acc_q = float((ref.argmax(1) == labels).mean()), float((got.argmax(1) == labels).mean())
    return {
        "float": acc_f,
        "int8": acc_q,
        "drop_points": (acc_f - acc_q) * 100,
        "agreement": float((ref.argmax(1) == got.argmax(1)).mean()),
    }


def iou(a: np.ndarray, b: np.ndarray) -> float:
    return float((a & b).sum() / max((a | b).sum(), 1))


def segmentation_metrics(ref: np.ndarray, got: np.ndarray, masks: np.ndarray) -> dict:
    truth, mf, mq = masks > 0.5, ref > 0, got > 0
    iou_f, iou_q = iou(mf, truth), iou(mq, truth)
    return {
        "float": iou_f,
        "int8": iou_q,
        "drop_points": (iou_f - iou_q) * 100,
        "agreement": float((mf == mq).mean()),
        "iou_vs_float": iou(mq, mf),
    }


def similarity_metrics(ref: np.ndarray, got: np.ndarray, mask: np.ndarray | None) -> dict:
    """Per sample: cosine of the flattened outputs and max |got - ref| / max |ref|; padding
    positions (mask 0) are zeroed in both first, since nothing downstream reads them."""
    if mask is not None:
        keep = mask.reshape(*mask.shape, *([1] * (ref.ndim - mask.ndim))).astype(ref.dtype)
        ref, got = ref * keep, got * keep
    a = ref.reshape(len(ref), -1).astype(np.float64)
    b = got.reshape(len(got), -1).astype(np.float64)
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    rel = np.abs(a - b).max(1) / np.abs(a).max(1)
    out = {"cosine": float(cos.mean()), "min_cosine": float(cos.min()), "max_rel": float(rel.max())}
    if ref.ndim == 3 and ref.shape[-1] == VOCAB:  # LM logits: does the next-token choice hold?
        out["argmax_agreement"] = float((ref.argmax(-1) == got.argmax(-1)).mean())
    return out


def score(case: Case, fp: Path, qp: Path) -> dict:
    ref, got = outputs(fp, case.evals), outputs(qp, case.evals)
    if not (np.isfinite(got).all() and np.isfinite(ref).all()):
        return {"non_finite_outputs": int((~np.isfinite(got)).sum())}
    if case.family == "classifier":
        return classifier_metrics(ref, got, case.truth)
    if case.family == "segmentation":
        return segmentation_metrics(ref, got, case.truth)
    mask = (
        np.concatenate([f["attention_mask"] for f in case.evals])
        if "attention_mask" in case.evals[0]
        else None
    )
    return similarity_metrics(ref, got, mask)


# ---------------------------------------------------------------- one model, stage by stage


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def export(case: Case, path: Path) -> tuple[str, list[str]]:
    """``modelpress.convert`` (verified against PyTorch); ``(exporter, notes)``."""
    # not ``modelpress.convert(...)``: after its first call that name is the modelpress.convert
    # subpackage (the import sets the attribute over the lazy function), so a second call fails.
    from modelpress.convert import convert

    r = convert(case.module, example_inputs=case.example, dynamic=case.dynamic, output=path)
    return r.exporter, [f"convert: {n}" for n in r.notes]


def check(fp: Path, qp: Path, feeds: dict) -> str:
    """The int8 file passes the onnx checker (``modelpress.load``) and runs under
    ``modelpress.verify`` (ORT, optimizations disabled); the tolerance verdict is not the point:
    int8 never meets float32's 1e-4."""
    import modelpress

    modelpress.load(qp)
    v = modelpress.verify(fp, qp, data=feeds)
    return f"ok (verify max rel {v.max_rel:.3g})"


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((got - ref) ** 2)))


ROUNDING = {  # variant → (file suffix, quantize options); "static" is the row's own int8 file
    "static, round to nearest": ("_rtn", {"mode": "static", "gptq": False}),
    "weight-only int8, GPTQ": ("_w8", {"mode": "weight-only", "bits": 8}),
    "weight-only int8, round to nearest": (
        "_w8rtn",
        {"mode": "weight-only", "bits": 8, "gptq": False},
    ),
    "weight-only int4, GPTQ": ("_w4", {"mode": "weight-only", "bits": 4}),
    "weight-only int4, round to nearest": (
        "_w4rtn",
        {"mode": "weight-only", "bits": 4, "gptq": False},
    ),
}


def rounding(case: Case, fp: Path, qp: Path) -> dict[str, float]:
    """Output SQNR (dB, held-out inputs) of the default static file (GPTQ-rounded weights) and of
    the same quantization with weights rounded to nearest; and of int8 and of 4-bit weights alone
    (weight-only mode: activations stay float), either way: what the rounding itself is worth."""
    from modelpress import save
    from modelpress.compress import quantize

    ref = outputs(fp, case.evals)
    out = {"static, GPTQ (default)": sqnr_db(ref, outputs(qp, case.evals))}
    for label, (suffix, options) in ROUNDING.items():
        path = WORK / f"{case.name}{suffix}.onnx"
        save(quantize(fp, data=case.calib, **options).model, path)
        out[label] = sqnr_db(ref, outputs(path, case.evals))
    return out


def run_case(name: str, quick: bool, reps: dict[str, int]) -> Row:
    from modelpress import save
    from modelpress.compress import quantize

    start = time.perf_counter()
    family = (
        "transformer"
        if name in TRANSFORMERS
        else ("segmentation" if name == "unet" else "classifier")
    )
    row = Row(case=name, family=family)
    try:
        case = transformer_case(name, quick) if name in TRANSFORMERS else cnn_case(name, quick)
        row.description = case.description
        if case.train_seconds:
            row.notes.append(f"trained {case.train_seconds:.1f} s")
        fp, qp = WORK / f"{name}.onnx", WORK / f"{name}_int8.onnx"
        row.stage = "convert"
        row.exporter, notes = export(case, fp)
        row.notes += notes
        row.stage = "quantize"
        mode = "dynamic" if family == "transformer" else "static"
        t0 = time.perf_counter()
        r = quantize(fp, mode=mode, data=case.calib)
        save(r.model, qp)
        row.quantize_seconds = time.perf_counter() - t0
        row.size_ratio = size(qp) / size(fp)
        row.notes += [f"quantize: {n}" for n in r.notes]
        quantized = sum(layer.quantized for layer in r.layers)
        row.notes.append(
            f"quantize: {quantized} of {len(r.layers)} candidate layers quantized, "
            f"output error on calibration {r.output_error if r.output_error is None else f'{r.output_error:.3g}'}"
        )
        row.stage = "check"
        try:
            row.check = check(fp, qp, case.evals[0])
        except Exception as exc:  # noqa: BLE001 - a failed check is a finding; scoring goes on
            row.check = f"FAILED: {first_line(exc)}"
        row.stage = "score"
        row.metrics = score(case, fp, qp)
        if family != "transformer":
            row.stage = "rounding"
            row.rounding = rounding(case, fp, qp)
        row.stage = "latency"
        row.latency = latency({"float32": fp, "int8": qp}, case.timing, reps=reps[family])
        row.stage = "done"
    except Exception as exc:  # noqa: BLE001 - an error is a finding, not the end of the run
        row.error = f"{row.stage}: {first_line(exc)}"
        (WORK / f"{name}_error.txt").write_text(traceback.format_exc())
    row.seconds = time.perf_counter() - start
    return row


# ---------------------------------------------------------------- report


def fmt_lat(v) -> str:
    med, p25, p75 = v
    return f"{med:.2f} ({p25:.2f}–{p75:.2f})"


def ratios(row: Row) -> dict[int, float]:
    if not row.latency:
        return {}
    return {b: row.latency["int8"][b][0] / row.latency["float32"][b][0] for b in (1, 8)}


def _common(row: Row) -> list[str]:
    r = ratios(row)
    lat = [
        f"{fmt_lat(row.latency['float32'][b])} / {fmt_lat(row.latency['int8'][b])} | **{r[b]:.2f}**"
        if row.latency
        else "– | –"
        for b in (1, 8)
    ]
    return [
        row.exporter or "–",
        f"{row.size_ratio:.2f}x" if row.size_ratio else "–",
        f"{row.quantize_seconds:.1f}" if row.quantize_seconds is not None else "–",
        *lat,
        row.check or "–",
    ]


TAIL = "exporter | size int8/f32 | quantize s | b1 ms f32 / int8 | b1 ratio | b8 ms f32 / int8 | b8 ratio | int8 file check"
TABLES = {
    "classifier": (
        "CNN classifiers, mode=static (top-1 accuracy on 450 held-out digits at 3x64x64)",
        "model | acc f32 | acc int8 | drop (points) | top-1 agreement | " + TAIL,
        lambda m: [
            f"{m['float']:.4f}",
            f"{m['int8']:.4f}",
            f"{m['drop_points']:.2f}",
            f"{m['agreement']:.4f}",
        ],
    ),
    "segmentation": (
        "Segmentation CNN, mode=static (IoU with the true mask of bright shapes, 3x64x64)",
        "model | IoU f32 | IoU int8 | drop (points) | pixel agreement | IoU int8 vs f32 | " + TAIL,
        lambda m: [
            f"{m['float']:.4f}",
            f"{m['int8']:.4f}",
            f"{m['drop_points']:.2f}",
            f"{m['agreement']:.4f}",
            f"{m['iou_vs_float']:.4f}",
        ],
    ),
    "transformer": (
        f"Transformers, mode=dynamic (random weights; outputs on held-out inputs, sequence {EVAL_SEQ}; timed at sequence {TIME_SEQ})",
        "model | mean cosine | min cosine | max rel error | LM argmax agreement | " + TAIL,
        lambda m: [
            f"{m['cosine']:.5f}",
            f"{m['min_cosine']:.5f}",
            f"{m['max_rel']:.3g}",
            f"{m['argmax_agreement']:.4f}" if "argmax_agreement" in m else "–",
        ],
    ),
}


def table(family: str, rows: list[Row]) -> list[str]:
    title, head, metric_cells = TABLES[family]
    width = head.count("|") + 1
    lines = [f"## {title}", "", f"| {head} |", "|" + "---|" * width]
    for row in rows:
        if row.error and not row.metrics:
            lines.append(f"| {row.case} | **failed at {row.error}** |" + " |" * (width - 2))
            continue
        m = row.metrics
        cells = (
            metric_cells(m)
            if "non_finite_outputs" not in m
            else (
                [f"**{m['non_finite_outputs']} non-finite int8 outputs**"]
                + ["–"] * (head.split("|").index(" exporter ") - 2)
            )
        )
        lines.append("| " + " | ".join([row.case, *cells, *_common(row)]) + " |")
    lines.append("")
    for row in rows:
        lines.append(
            f"- **{row.case}**: {row.description}" + (f" (error: {row.error})" if row.error else "")
        )
        lines += [f"  - {n}" for n in row.notes]
    lines.append("")
    return lines


def findings(rows: list[Row]) -> list[str]:
    """The short list the page leads with: slower in int8, accuracy lost beyond the limits, failures."""
    out = []
    slow = [
        f"{r.case} (b1 {ratios(r)[1]:.2f}, b8 {ratios(r)[8]:.2f})"
        for r in rows
        if r.latency and max(ratios(r).values()) > 1.0
    ]
    out.append(
        "- Slower in int8 than float32 (median ratio > 1 at batch 1 or 8): "
        + (", ".join(slow) or "none")
    )
    lossy = []
    for r in rows:
        m = r.metrics
        if "non_finite_outputs" in m:
            lossy.append(f"{r.case} (non-finite outputs)")
        elif "drop_points" in m and m["drop_points"] > ACCURACY_DROP_LIMIT:
            lossy.append(f"{r.case} (drop {m['drop_points']:.2f} points)")
        elif "cosine" in m and m["cosine"] < COSINE_LIMIT:
            lossy.append(f"{r.case} (mean cosine {m['cosine']:.4f})")
    out.append(
        f"- Accuracy lost beyond {ACCURACY_DROP_LIMIT} points (IoU points for the U-Net) or mean cosine < {COSINE_LIMIT}: "
        + (", ".join(lossy) or "none")
    )
    failed = [f"{r.case} ({r.error})" for r in rows if r.error]
    out.append("- Failed (exception): " + ("; ".join(failed) or "none"))
    bad_check = [f"{r.case} ({r.check})" for r in rows if r.check.startswith("FAILED")]
    out.append("- int8 file fails the onnx checker or verify: " + ("; ".join(bad_check) or "none"))
    return out


def write_report(rows: list[Row], seconds: float, command: str) -> str:
    import onnxruntime
    import torch

    lines = [
        "# Quantization on unseen architectures (modelpress defaults)",
        "",
        f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs (shared), "
        f"onnxruntime {onnxruntime.__version__}, torch {torch.__version__}. `{command}`, "
        f"{time.strftime('%Y-%m-%d')}, {seconds:.0f} s.",
        "Models are built, trained (CNNs) and converted by the script; `quantize(..., mode=static|dynamic, "
        "data=...)` with every other option at its default. Latency: ONNX Runtime CPU, all "
        "graph optimizations, one global thread pool, float32 and int8 interleaved; median (p25–p75) "
        "in ms; ratio = int8 / float32 medians (below 1: int8 faster).",
        "",
        "## Findings",
        "",
        *findings(rows),
        "",
    ]
    for family in TABLES:
        members = [r for r in rows if r.family == family]
        if members:
            lines += table(family, members)
    lines += rounding_table([r for r in rows if r.rounding])
    return "\n".join(lines)


def rounding_table(rows: list[Row]) -> list[str]:
    if not rows:
        return []
    variants = list(rows[0].rounding)
    return [
        "## Weight rounding: GPTQ against round to nearest",
        "",
        "Output SQNR against float32 on the held-out inputs, dB (higher: closer). Weight-only "
        "modes keep activations float, so their columns show the weights' own error (4 bits: "
        "blocks of 32 input channels; a Conv whose channels are not a multiple of 32 keeps int8).",
        "",
        "| model | " + " | ".join(variants) + " |",
        "|---|" + "---|" * len(variants),
        *[
            f"| {r.case} | " + " | ".join(f"{r.rounding[v]:.1f}" for v in variants) + " |"
            for r in rows
        ],
        "",
    ]


ALL = [*CNN_BUILDERS, *TRANSFORMERS]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--quick", action="store_true", help="less training, fewer samples and repetitions"
    )
    ap.add_argument("--models", nargs="+", default=ALL, choices=ALL)
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    reps = (
        {"classifier": 40, "segmentation": 30, "transformer": 10}
        if args.quick
        else {
            "classifier": 150,
            "segmentation": 100,
            "transformer": 30,
        }
    )
    start = time.perf_counter()
    rows = []
    for name in args.models:
        print(f"{name}: ...", flush=True)
        row = run_case(name, args.quick, reps)
        rows.append(row)
        print(
            f"{name}: {row.seconds:.0f} s, stage {row.stage}, metrics {json.dumps(row.metrics)}, "
            f"ratios {ratios(row)}" + (f", ERROR {row.error}" if row.error else ""),
            flush=True,
        )
    command = "benchmarks/bench_quantize_unseen.py" + (" --quick" if args.quick else "")
    if args.models != ALL:
        command += " --models " + " ".join(args.models)
    text = write_report(rows, time.perf_counter() - start, command)
    (WORK / "rows.json").write_text(json.dumps([r.__dict__ for r in rows], indent=1, default=str))
    if args.quick or args.models != ALL:
        out = WORK / "quantize_unseen.md"  # a partial run does not replace the results page
    else:
        RESULTS.mkdir(exist_ok=True)
        out = RESULTS / "quantize_unseen.md"
    out.write_text(text + "\n")
    print(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
