"""quantize_llm on a tiny converted decoder: formats agree, quality holds, bad input is one line."""

import json

import numpy as np
import onnx_ir as ir
import pytest
from llm_convert_testing import tiny_llm

from modelpress.compress.llm import quantize_llm
from modelpress.compress.llm.calibrate import collect, quantizable_matmuls
from modelpress.compress.llm.quantize import quantize_weight
from modelpress.errors import InputError, ModelSaveError, OptionError
from modelpress.ir import llm, load
from modelpress.verify.llm import Decoder, perplexity_of_ids, prompts_from_text, top1_agreement
from modelpress.zoo.llm import VOCAB

TEXT = (
    "The quick brown fox jumps over the lazy dog. A language model predicts the next word from "
    "the words before it. Quantization trades a little accuracy for speed and memory. Once upon a "
    "time there was a small model that ran on every CPU. ONNX Runtime runs the decoder one token "
    "at a time, with its cache. Hello world! How are you today? I am fine, thank you. "
) * 6


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llm")
    tiny_llm(tmp, text=TEXT)
    return tmp


def _logits(path, ids):
    # optimizations off: at "all" ONNX Runtime turns DequantizeLinear + MatMul into MatMulNBits
    # with int8 activations (accuracy_level 4), which is not the arithmetic the file states
    return Decoder.open(path, threads=1, optimize="disabled").logits(ids)


def test_formats_agree_and_quality_holds(folder):
    text = folder / "text.txt"
    # float activations (accuracy_level 0) so that both formats state the same arithmetic;
    # symmetric, as asymmetric grids differ by level (float zero points for MatMulNBits only)
    opts = dict(data=text, seq_len=64, samples=8, symmetric=True)
    fast = quantize_llm(folder / "float", folder / "int4", accuracy_level=0, **opts)
    quantize_llm(folder / "float", folder / "int4_std", level="standard", **opts)
    assert {layer.method for layer in fast.layers} <= {"clip", "gptq", "gptq-act"}
    cfg = json.loads((folder / "int4" / llm.CONFIG_FILE).read_text())
    assert cfg["quantization"]["mode"] == "int4" and cfg["quantization"]["calibration"]["tokens"]
    assert cfg["level"] == "ort"
    assert (folder / "int4" / llm.TOKENIZER_FILE).is_file()
    ops = {n.op_type for n in load(folder / "int4" / llm.MODEL_FILE).graph}
    assert {"MatMulNBits", "GatherBlockQuantized"} <= ops
    ops = {n.op_type for n in load(folder / "int4_std" / llm.MODEL_FILE).graph}
    assert "MatMulNBits" not in ops and "DequantizeLinear" in ops
    # the default writes int8 activations (accuracy_level 4): the fast CPU kernel
    quantize_llm(folder / "float", folder / "int4_rtn")
    levels = {
        a.value
        for n in load(folder / "int4_rtn" / llm.MODEL_FILE).graph
        if n.op_type == "MatMulNBits"
        for name, a in n.attributes.items()
        if name == "accuracy_level"
    }
    assert levels == {4}
    ids = Decoder.open(folder / "float").encode(TEXT)[:48]
    # the same codes written two ways compute the same logits
    a, b = _logits(folder / "int4", ids), _logits(folder / "int4_std", ids)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(a).max())
    ref, q = Decoder.open(folder / "float"), Decoder.open(folder / "int4")
    all_ids = ref.encode(TEXT)
    p_ref = perplexity_of_ids(ref, all_ids, window=64, stride=32)
    p_q = perplexity_of_ids(q, all_ids, window=64, stride=32)
    assert 0.9 < p_q.perplexity / p_ref.perplexity < 1.1
    agree = top1_agreement(ref, q, prompts_from_text(ref, TEXT, count=4, length=8), steps=8)
    assert agree.top1_agreement > 0.6


def test_gptq_and_awq_beat_rtn_on_the_models_own_activations(folder):
    model = load(folder / "float" / llm.MODEL_FILE)
    nodes = quantizable_matmuls(model)
    stats, tokens = collect(folder / "float", model, nodes, TEXT, seq_len=64, samples=8)
    assert tokens == 8 * 64
    wins = 0
    for node in nodes[:-1]:  # the layers, not the head
        w = node.inputs[1].const_value.numpy()
        _, _, errors, _ = quantize_weight(
            w,
            stats[node.inputs[0].name],
            None,
            bits=4,
            block_size=32,
            symmetric=False,
            candidates=("rtn", "clip", "gptq", "gptq-act"),
        )
        wins += min(errors["gptq"], errors["gptq-act"]) < errors["rtn"]
        assert errors["clip"] <= errors["rtn"] * 1.05
    assert wins >= len(nodes[:-1]) - 1


def test_sequential_stages_and_int8_layers(folder):
    """Inputs measured through the layers already quantized, and the two MatMuls most hurt by
    4 bits kept at 8: still runs in ONNX Runtime, 8-bit where reported, perplexity near float."""
    r = quantize_llm(
        folder / "float",
        folder / "int4_seq",
        data=folder / "text.txt",
        seq_len=64,
        samples=8,
        stages=3,
        int8_layers=2,
        float_zero_points=True,
        accuracy_level=0,
    )
    eight = [layer for layer in r.layers if layer.bits == 8 and layer.n != VOCAB]
    assert len(eight) >= 2
    nbits_of = {
        n.name: n.attributes["bits"].value
        for n in load(folder / "int4_seq" / llm.MODEL_FILE).graph
        if n.op_type == "MatMulNBits"
    }
    assert sorted(nbits_of.values()).count(8) == sum(layer.bits == 8 for layer in r.layers)
    graph = load(folder / "int4_seq" / llm.MODEL_FILE).graph
    four = [n for n in graph if n.op_type == "MatMulNBits" and n.attributes["bits"].value == 4]
    # float zero points as asked, written as codes at zero point 0 plus each block's offset
    # (``ir.nbits``): every 4-bit product is followed by the Add of its offsets
    assert {n.inputs[3].const_value.dtype for n in four} == {ir.DataType.UINT8}
    assert all(any(c.op_type == "Add" for c in n.outputs[0].consumers()) for n in four), (
        "4-bit products without their block offsets"
    )
    ref, q = Decoder.open(folder / "float"), Decoder.open(folder / "int4_seq")
    ids = ref.encode(TEXT)
    p_ref = perplexity_of_ids(ref, ids, window=64, stride=32)
    p_q = perplexity_of_ids(q, ids, window=64, stride=32)
    assert 0.9 < p_q.perplexity / p_ref.perplexity < 1.1
    with pytest.raises(OptionError, match="`stages`"):
        quantize_llm(folder / "float", folder / "x", stages=0)
    with pytest.raises(OptionError, match="`int8_layers`"):
        quantize_llm(folder / "float", folder / "x", int8_layers=-1)


def test_without_data_rtn_and_int8(folder):
    # float activations: the bound is that of the int8 weights' rounding alone
    r = quantize_llm(
        folder / "float", folder / "int8", mode="int8", embeddings="float", accuracy_level=0
    )
    assert r.method == "rtn" and any("RTN" in n for n in r.notes)
    ops = [n.op_type for n in load(folder / "int8" / llm.MODEL_FILE).graph]
    assert "GatherBlockQuantized" not in ops and "Gather" in ops
    ids = Decoder.open(folder / "float").encode(TEXT)[:32]
    a, b = _logits(folder / "float", ids), _logits(folder / "int8", ids)
    np.testing.assert_allclose(b, a, rtol=0, atol=0.02 * np.abs(a).max())


def test_bad_input(folder):
    src = folder / "float"
    with pytest.raises(OptionError, match="`mode`"):
        quantize_llm(src, folder / "x", mode="int3")
    with pytest.raises(OptionError, match="`block_size`"):
        quantize_llm(src, folder / "x", block_size=48)
    with pytest.raises(InputError, match="no such file"):
        quantize_llm(src, folder / "x", data=folder / "missing.txt")
    (folder / "empty.txt").write_text("  \n")
    with pytest.raises(InputError, match="empty"):
        quantize_llm(src, folder / "x", data=folder / "empty.txt")
    with pytest.raises(ModelSaveError, match="must not be the input"):
        quantize_llm(src, src)
    assert not (folder / "x").exists()


def test_measured_int4_cost_equals_a_model_with_that_weight_rounded(folder, tmp_path):
    """``sensitivity.measure`` feeds the rounded weight through an overridable initializer; the
    same KL must come out of a saved model whose weight was rounded, scored separately."""
    from modelpress.compress.llm import sensitivity
    from modelpress.compress.llm.calibrate import text_windows
    from modelpress.ir import save

    src = folder / "float"
    model = load(src / llm.MODEL_FILE)
    body = quantizable_matmuls(model)[:-1]
    cost = sensitivity.measure(
        src, model, body, TEXT, block_size=32, symmetric=False, seq_len=48, windows=2
    )
    assert set(cost) == {n.name for n in body} and all(c > 0 for c in cost.values())
    assert len(model.graph.inputs) == len(load(src / llm.MODEL_FILE).graph.inputs)
    worst = max(cost, key=cost.get)
    node = next(n for n in body if n.name == worst)
    w = node.inputs[1].const_value.numpy().astype(np.float32)
    w_hat = sensitivity.rounded(w, bits=4, block_size=32, symmetric=False)
    node.inputs[1].const_value = ir.tensor(w_hat, name=node.inputs[1].name)
    out = tmp_path / "rounded"
    out.mkdir()
    for f in src.iterdir():
        if not f.name.startswith(llm.MODEL_FILE):
            (out / f.name).write_bytes(f.read_bytes())
    save(model, out / llm.MODEL_FILE, external_data=True)
    ref = Decoder.open(src, threads=1, optimize="basic")
    test = Decoder.open(out, threads=1, optimize="basic")
    kl, count = 0.0, 0
    for ids in text_windows(ref, TEXT, seq_len=48, samples=2):
        p = sensitivity._log_softmax(ref.logits(ids))
        q = sensitivity._log_softmax(test.logits(ids))
        kl += float(np.sum(np.exp(p) * (p - q)))
        count += len(ids)
    assert cost[worst] == pytest.approx(kl / count, rel=1e-3)
    # the MatMuls kept at 8 bits are the ones measured costliest, and their cost is reported
    r = quantize_llm(
        src,
        folder / "int4_mixed",
        data=folder / "text.txt",
        seq_len=48,
        samples=4,
        method="rtn",
        int8_layers=2,
    )
    eight = {layer.name for layer in r.layers if layer.bits == 8 and layer.n != VOCAB}
    reported = {layer.name: layer.int4_cost for layer in r.layers if layer.n != VOCAB}
    assert all(c is not None and c > 0 for c in reported.values())
    assert eight == set(sorted(reported, key=reported.get)[-2:])


def _quantization(path) -> dict:
    return json.loads((path / llm.CONFIG_FILE).read_text())["quantization"]


def test_auto_keeps_awq_scales_only_where_its_candidates_gain(folder, monkeypatch):
    """AWQ's α is searched with rounding to nearest; ``auto`` then quantizes with GPTQ or the
    clip search, so a group keeps its scales only if they lower the group's held-out error after
    those candidates. A scaling that wrecks the grids (scales spread over 10⁴) is turned down
    in every group by ``auto``, and kept by ``awq``, which does not judge it again."""
    from modelpress.compress.llm import awq

    def wrecking(weights, h_fit, h_eval, mean_abs, **_):
        return 1.0, np.exp(np.random.default_rng(0).normal(0, 3, len(mean_abs))), {}

    monkeypatch.setattr(awq, "search", wrecking)
    opts = dict(data=folder / "text.txt", seq_len=64, samples=8)
    auto = quantize_llm(folder / "float", folder / "auto_wreck", method="auto", **opts)
    declined = _quantization(folder / "auto_wreck")
    assert declined["awq_groups"] == 0 and declined["awq_groups_unscaled"] > 0
    assert all(layer.alpha == 0 for layer in auto.layers)
    kept = quantize_llm(folder / "float", folder / "awq_wreck", method="awq", **opts)
    q = _quantization(folder / "awq_wreck")
    assert q["awq_groups"] == declined["awq_groups_unscaled"] and q["awq_groups_unscaled"] == 0
    assert any(layer.alpha > 0 for layer in kept.layers)
    # what auto wrote is what it writes when the search finds no scaling at all
    monkeypatch.setattr(awq, "search", lambda *a, **k: (0.0, None, {}))
    quantize_llm(folder / "float", folder / "auto_plain", method="auto", **opts)
    ids = Decoder.open(folder / "float").encode(TEXT)[:32]
    np.testing.assert_array_equal(
        _logits(folder / "auto_wreck", ids), _logits(folder / "auto_plain", ids)
    )
