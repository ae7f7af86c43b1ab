"""Check a converted decoder against transformers in float32, on a prompt and through its cache.

Three runs of the ONNX decoder (ONNX Runtime, its optimizations disabled so they cannot hide a
wrong graph) against the transformers model of the same checkpoint (float32, eager attention):

1. prefill: the prompt's logits at every position;
2. decode: 32 greedy steps, each feeding the previous step's argmax through the KV cache; the
   transformers model runs once over prompt + generated tokens, and its logits at those positions
   are the reference of each step (the cache must reproduce a full forward pass);
3. padding: a batch of two prompts, the shorter left-padded (a hole in the mask), each real
   position against the same batch in transformers.

Logits pass when ``max|onnx - reference| <= rtol * max(1, max|reference|)`` (``rtol`` 1e-4 by
default: float32 sums in a different order, not a different computation), and the greedy tokens
must be transformers' argmax at every step, except where transformers' own top two are closer than
the measured error (a tie the order of float additions may break either way).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from modelpress.convert.llm.checkpoint import Checkpoint
from modelpress.errors import VerificationError, require
from modelpress.ir.llm import (
    ATTENTION_MASK,
    INPUT_IDS,
    LOGITS,
    POSITION_IDS,
    DecoderConfig,
    past_feed,
    past_names,
    present_names,
)
from modelpress.runtime.ort import session, session_options

PROMPT = "The quick brown fox jumps over the lazy dog, and then it"
SHORT_PROMPT = "Once upon a time"
DEFAULT_RTOL = 1e-4
STEPS = 32


@dataclass
class DecoderCheck:
    """How the converted decoder compares with transformers."""

    prompt_tokens: int
    steps: int
    prompt_max_abs: float
    decode_max_abs: float
    padded_max_abs: float
    scale: float  # max |reference logit|
    rtol: float
    tokens: list[int] = field(default_factory=list)  # the ONNX decoder's greedy tokens
    reference_tokens: list[int] = field(default_factory=list)
    token_mismatches: int = 0  # outside near-ties

    @property
    def tolerance(self) -> float:
        return self.rtol * max(1.0, self.scale)

    @property
    def passed(self) -> bool:
        worst = max(self.prompt_max_abs, self.decode_max_abs, self.padded_max_abs)
        return worst <= self.tolerance and self.token_mismatches == 0

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "prompt_tokens": self.prompt_tokens,
            "steps": self.steps,
            "prompt_max_abs": self.prompt_max_abs,
            "decode_max_abs": self.decode_max_abs,
            "padded_max_abs": self.padded_max_abs,
            "scale": self.scale,
            "rtol": self.rtol,
            "tolerance": self.tolerance,
            "token_mismatches": self.token_mismatches,
            "tokens": self.tokens,
        }

    def raise_if_failed(self) -> None:
        if self.passed:
            return
        if self.token_mismatches:
            raise VerificationError(
                f"the ONNX decoder and transformers disagree on {self.token_mismatches} of "
                f"{self.steps} greedy tokens"
            )
        worst = max(self.prompt_max_abs, self.decode_max_abs, self.padded_max_abs)
        raise VerificationError(
            f"the ONNX decoder's logits differ from transformers': max abs {worst:.3g} "
            f"(prompt {self.prompt_max_abs:.3g}, decode {self.decode_max_abs:.3g}, padded "
            f"{self.padded_max_abs:.3g}), tolerance {self.tolerance:.3g}"
        )


class _Runner:
    """The decoder on ONNX Runtime: a forward step with the cache carried between calls."""

    def __init__(self, model_path: Path, config: DecoderConfig):
        self.sess = session(str(model_path), options=session_options(optimize="disabled"))
        self.config = config

    def empty_cache(self, batch: int) -> dict[str, np.ndarray]:
        c = self.config
        shape = (batch, c.num_kv_heads, 0, c.head_dim)
        return {n: np.zeros(shape, np.float32) for i in range(c.num_layers) for n in past_names(i)}

    def step(self, ids, mask, positions, cache):
        layout, seq = self.config.kv_layout, ids.shape[1]
        cache = {name: past_feed(layout, a, seq) for name, a in cache.items()}
        feeds = {INPUT_IDS: ids, ATTENTION_MASK: mask, POSITION_IDS: positions, **cache}
        names = [LOGITS] + [n for i in range(self.config.num_layers) for n in present_names(i)]
        out = dict(zip(names, self.sess.run(names, feeds)))
        new_cache = {}
        for i in range(self.config.num_layers):
            for past, present in zip(past_names(i), present_names(i)):
                new_cache[past] = out[present]
        return out[LOGITS], new_cache


def _prompt_ids(ckpt: Checkpoint, text: str, vocab: int) -> list[int]:
    tokenizers = require("tokenizers", extra="llm", purpose="verifying a decoder")
    tok = tokenizers.Tokenizer.from_str(json.dumps(ckpt.tokenizer["tokenizer.json"]))
    ids = [i for i in tok.encode(text, add_special_tokens=False).ids if i < vocab]
    if len(ids) < 2:  # a tokenizer that knows none of it: fixed ids instead
        ids = [(7 * k + 3) % vocab for k in range(8)]
    return ids


def _quiet(transformers) -> None:
    # Loading prints progress bars and advice meant for notebooks; a converter's output is its own.
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()


def reference_model(ckpt: Checkpoint):
    """The transformers model of ``ckpt`` in float32 with eager attention."""
    transformers = require("transformers", extra="llm", purpose="verifying a decoder")
    _quiet(transformers)
    require("torch", extra="torch", purpose="verifying a decoder against transformers")
    src = Path(ckpt.source)
    kwargs = {"dtype": "float32", "attn_implementation": "eager"}
    if ckpt.kind == "gguf":
        return gguf_reference(src, config=ckpt.config)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(src), local_files_only=True, **kwargs
    )
    return model.float().eval()


def gguf_reference(path: Path, *, config=None):
    """transformers' model of a GGUF file, its weights read by transformers' own GGUF reader.

    (``from_pretrained(gguf_file=...)`` would do the same but wants ``accelerate``.) ``config``:
    the transformers config already read from the file (reading it again parses the whole
    vocabulary again)."""
    transformers = require("transformers", extra="llm", purpose="verifying a decoder")
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    _quiet(transformers)

    if config is None:
        config = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    model = transformers.AutoModelForCausalLM.from_config(
        copy.deepcopy(config), dtype="float32", attn_implementation="eager"
    )
    with contextlib.redirect_stderr(io.StringIO()):  # its own tqdm bar, not switched off above
        loaded = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    tensors = loaded["tensors"]
    model.load_state_dict(tensors, strict=False)
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.float().eval()


def _torch_logits(model, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    import torch

    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.inference_mode():
        out = model(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            position_ids=torch.from_numpy(positions),
            use_cache=False,
        )
    return out.logits.float().numpy()


def check_decoder(
    model_path: Path,
    config: DecoderConfig,
    ckpt: Checkpoint,
    *,
    reference=None,
    steps: int = STEPS,
    rtol: float = DEFAULT_RTOL,
) -> DecoderCheck:
    """Compare the decoder at ``model_path`` with transformers (``reference``: a loaded model)."""
    ref = reference if reference is not None else reference_model(ckpt)
    runner = _Runner(model_path, config)
    prompt = _prompt_ids(ckpt, PROMPT, config.vocab_size)
    n = len(prompt)

    # prefill, then greedy decode through the cache
    ids = np.array([prompt], np.int64)
    logits, cache = runner.step(
        ids,
        np.ones((1, n), np.int64),
        np.arange(n, dtype=np.int64)[None],
        cache=runner.empty_cache(1),
    )
    rows = [logits[0]]
    tokens = [int(logits[0, -1].argmax())]
    for s in range(steps - 1):
        total = n + s + 1
        logits, cache = runner.step(
            np.array([[tokens[-1]]], np.int64),
            np.ones((1, total), np.int64),
            np.array([[total - 1]], np.int64),
            cache,
        )
        rows.append(logits[0])
        tokens.append(int(logits[0, -1].argmax()))
    got = np.concatenate(rows, axis=0)  # [n + steps - 1, vocab]
    full = np.array([prompt + tokens[:-1]], np.int64)
    expected = _torch_logits(ref, full, np.ones_like(full))[0]
    diff = np.abs(got - expected).max(axis=-1)
    prompt_max, decode_max = float(diff[:n].max()), float(diff[n:].max()) if steps > 1 else 0.0
    scale = float(np.abs(expected).max())

    ref_tokens = [int(expected[n - 1 + s].argmax()) for s in range(steps)]
    worst = max(prompt_max, decode_max)
    mismatches = 0
    for s, (a, b) in enumerate(zip(tokens, ref_tokens)):
        if a != b:
            top = np.sort(expected[n - 1 + s])[-2:]
            if top[1] - top[0] > 2 * worst:  # not a tie within the measured error
                mismatches += 1

    # a padded batch: the short prompt right-padded (the cache is left-aligned: a row's mask is
    # ones followed by zeros)
    short = _prompt_ids(ckpt, SHORT_PROMPT, config.vocab_size)[: max(1, n - 2)]
    pad = n - len(short)
    batch = np.array([prompt, short + [0] * pad], np.int64)
    mask = np.array([[1] * n, [1] * len(short) + [0] * pad], np.int64)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    got_b, _ = runner.step(batch, mask, positions, runner.empty_cache(2))
    exp_b = _torch_logits(ref, batch, mask)
    real = mask.astype(bool)
    padded_max = float(np.abs(got_b - exp_b).max(axis=-1)[real].max())
    return DecoderCheck(
        prompt_tokens=n,
        steps=steps,
        prompt_max_abs=prompt_max,
        decode_max_abs=decode_max,
        padded_max_abs=padded_max,
        scale=scale,
        rtol=rtol,
        tokens=tokens,
        reference_tokens=ref_tokens,
        token_mismatches=mismatches,
    )
