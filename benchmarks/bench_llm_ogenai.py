"""onnxruntime-genai as the int4 quality peer of ``bench_llm.py --only quality``.

Its model builder (``onnxruntime_genai.models.builder``, the version in ``bench_llm_decode``)
quantizes a Hugging Face folder of the same weights, and its perplexity is scored on the same
token ids and windows as modelpress' (``verify.llm.perplexity_of_ids``' rules), from the logits
its generator returns for a whole window (``Generator.get_output("logits")``), in a process of
its own venv (``bench_llm_decode.decode_install_peers``).

Variants (``ALGOS``): the builder's default (round to nearest, symmetric, the default CLI
choice) and ``k_quant_mixed`` (its most accurate option on CPU: k-quant rounding, the LM head
and llama.cpp's mixed set of sensitive layers at 8 bits), each at the block size of the row.

The rotated model's Hugging Face folder applies the rotation of ``bench_llm.rotated_folder`` to
the float folder's weights (``smollm2-hf``), unties the LM head and sets every norm gain to 1;
its logits are checked against the unrotated model's before use.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
from bench_llm_decode import OGENAI_VENV, WORK, decode_hf_folder, decode_install_peers

ALGOS = {"rtn": "default", "k_quant_mixed": "k_quant_mixed"}

# A peer's perplexity in its own interpreter: the script defines ``logits(window ids)`` (float
# logits of every position) and this loop scores windows as ``verify.llm.perplexity_of_ids`` does.
PEER_PERPLEXITY = r"""
total, count, scored_to = 0.0, 0, 1
for begin in range(0, len(ids) - 1, stride):
    end = min(begin + window, len(ids))
    if end <= scored_to:
        continue
    z = np.asarray(logits(ids[begin:end]), dtype=np.float64)
    first = max(scored_to, begin + 1)
    rows = z[first - 1 - begin : end - 1 - begin]
    m = rows.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(rows - m).sum(axis=1))
    total -= float((rows[np.arange(len(rows)), ids[first:end]] - lse).sum())
    count += end - first
    scored_to = end
    if end == len(ids):
        break
json.dump({"perplexity": math.exp(total / count), "tokens": count}, open(sys.argv[2], "w"))
"""

PPL_SCRIPT = (
    r"""
import json, math, sys
import numpy as np
import onnxruntime_genai as og
args = json.load(open(sys.argv[1]))
ids, window, stride = args["ids"], args["window"], args["stride"]
config = og.Config(args["folder"]); config.clear_providers()
options = {"intra_op_num_threads": args["threads"], "inter_op_num_threads": 1}
config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
model = og.Model(config)

def logits(window_ids):
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=window + 1)
    gen = og.Generator(model, params)
    gen.append_tokens(window_ids)
    return gen.get_output("logits")[0]
"""
    + PEER_PERPLEXITY
)

ROTATE_SCRIPT = r"""
import json, sys
import numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, out = sys.argv[1], sys.argv[2]
m = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float64)
tok = AutoTokenizer.from_pretrained(src)
hidden = m.config.hidden_size
rng = np.random.default_rng(0)
q, r = np.linalg.qr(rng.standard_normal((hidden, hidden)))
q = torch.tensor(q * np.sign(np.diag(r)), dtype=torch.float64)
ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog. " * 8)])
with torch.no_grad():
    before = m(ids).logits
    head = (m.lm_head.weight * m.model.norm.weight[None, :]) @ q
    m.config.tie_word_embeddings = False
    m.model.embed_tokens.weight = torch.nn.Parameter(m.model.embed_tokens.weight @ q)
    m.lm_head.weight = torch.nn.Parameter(head.clone())
    m.model.norm.weight.fill_(1.0)
    for layer in m.model.layers:
        a, f = layer.self_attn, layer.mlp
        for norm, projs in ((layer.input_layernorm, (a.q_proj, a.k_proj, a.v_proj)),
                            (layer.post_attention_layernorm, (f.gate_proj, f.up_proj))):
            for p in projs:
                p.weight.copy_((p.weight * norm.weight[None, :]) @ q)
            norm.weight.fill_(1.0)
        for p in (a.o_proj, f.down_proj):
            p.weight.copy_(q.T @ p.weight)
    after = m(ids).logits
err = float((after - before).abs().max())
assert err < 1e-3, err  # LlamaRMSNorm computes in float32 whatever the dtype
m.to(torch.float32).save_pretrained(out)
tok.save_pretrained(out)
print(json.dumps({"max_logit_difference": err}))
"""


def hf_folder(model: str) -> Path:
    """The Hugging Face folder of ``model`` (``smollm2`` or ``smollm2-rotated``)."""
    base = decode_hf_folder()
    if model == "smollm2":
        return base
    out = WORK / "smollm2-rotated-hf"
    if not (out / "config.json").exists():
        py = str(OGENAI_VENV / "bin" / "python")
        subprocess.run([py, "-c", ROTATE_SCRIPT, str(base), str(out)], check=True)
    return out


def int4_folder(model: str, block: int, algo: str) -> Path:
    """onnxruntime-genai's int4 build of ``model`` at ``block`` with ``ALGOS[algo]``."""
    out = WORK / f"ogenai-{model}-int4-b{block}-{algo}"
    if (out / "genai_config.json").exists():
        return out
    py = str(OGENAI_VENV / "bin" / "python")
    cmd = [py, "-m", "onnxruntime_genai.models.builder", "-m", str(hf_folder(model))]
    cmd += ["-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(WORK / "ogenai-cache")]
    cmd += ["--extra_options", f"block_size={block}", f"algo_config={ALGOS[algo]}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return out


def perplexity(folder: Path, ids: np.ndarray, *, window: int, stride: int, threads: int) -> dict:
    """onnxruntime-genai's perplexity of ``folder`` on ``ids`` (module docstring)."""
    script, inp, out = WORK / "ogenai_ppl.py", WORK / "ogenai_in.json", WORK / "ogenai_out.json"
    script.write_text(PPL_SCRIPT)
    job = {"ids": [int(i) for i in ids], "window": window, "stride": stride}
    inp.write_text(json.dumps({**job, "folder": str(folder), "threads": threads}))
    subprocess.run(
        [str(OGENAI_VENV / "bin" / "python"), str(script), str(inp), str(out)], check=True
    )
    return json.loads(out.read_text())


def rows(model: str, block: int, ids: np.ndarray, base: float, **kw) -> list[dict]:
    """The quality rows of onnxruntime-genai for ``model`` at ``block`` (every ``ALGOS``)."""
    decode_install_peers()
    out = []
    for algo in ALGOS:
        folder = int4_folder(model, block, algo)
        p = perplexity(folder, ids, **kw)
        size = sum(f.stat().st_size for f in folder.glob("model.onnx*")) / 1e6
        out.append(
            {
                "model": model,
                "variant": f"onnxruntime-genai int4 b{block} {algo}",
                "perplexity": p["perplexity"],
                "ratio": p["perplexity"] / base,
                "tokens": p["tokens"],
                "size_mb": size,
            }
        )
        print(f"{model} {out[-1]['variant']}: ppl {p['perplexity']:.4f}", flush=True)
    return out
