"""Built-in workloads against the published parameter and MAC counts of the architectures."""

from __future__ import annotations

import pytest

from modelpress.errors import OptionError
from modelpress.profile import WORKLOADS, get_workload


def _macs(w):
    return sum(k.flops for k in w.kernels if k.kind in ("conv", "matmul")) / 2


@pytest.mark.parametrize(
    ("name", "params", "gmacs"),
    [
        ("resnet50", 25_557_032, 4.09),  # torchvision resnet50: 25,557,032 parameters, 4.09 GMACs
        ("mobilenet-v2", 3_504_872, 0.30),  # torchvision mobilenet_v2: 3,504,872, 0.30 GMACs
        ("bert-base", 109_482_240, None),  # Hugging Face BertModel (with pooler)
        ("bert-large", 335_141_888, None),
    ],
)
def test_counts(name, params, gmacs):
    w = get_workload(name)
    assert w.params == params
    if gmacs is not None:
        assert _macs(w) / 1e9 == pytest.approx(gmacs, rel=0.01)


def test_resnet50_is_8_gflops_per_image():
    assert get_workload("resnet50").flops_per_sample / 1e9 == pytest.approx(8.2, rel=0.01)


def test_bert_flops_follow_2n_per_token_plus_attention():
    s = 384
    w = get_workload("bert-large", seq=s)
    encoder_params = 24 * (4 * 1024 * 1024 + 2 * 1024 * 4096)
    matmul = sum(k.flops for k in w.kernels if k.kind == "matmul")
    # 2·N per token for the weight products, 4·s·h per token per layer for QKᵀ and PV, plus biases and pooler
    expected = 2 * encoder_params * s + 24 * 4 * s * s * 1024
    assert matmul == pytest.approx(expected, rel=0.002)


def test_every_builtin_builds_and_unknown_name():
    for name in WORKLOADS:
        assert get_workload(name).flops_per_sample > 0
    assert get_workload("ResNet-50").name == "resnet50"
    with pytest.raises(OptionError, match="unknown; choose one of resnet50"):
        get_workload("vgg16")
    with pytest.raises(OptionError, match="512 positions"):
        get_workload("bert-base", seq=1024)
