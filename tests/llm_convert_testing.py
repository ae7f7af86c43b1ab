"""Helpers of the LLM conversion tests: greedy decoding of an LLM folder on ONNX Runtime, and the
same with transformers' ``generate`` (the reference)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modelpress.ir.llm import MODEL_FILE, past_feed, past_names, present_names, read_config


def tiny_llm(root: Path, *, seed: int = 0, text: str | None = None, name: str = "float") -> Path:
    """A tiny random llama converted into ``root / name`` (unverified: the convert tests verify);
    ``text``: also written to ``root / "text.txt"``."""
    convert = pytest.importorskip("modelpress.convert.llm")
    zoo = pytest.importorskip("modelpress.zoo.llm")
    convert.convert_llm(
        zoo.tiny_checkpoint(root / "ckpt", "llama", seed=seed), output=root / name, verify=False
    )
    if text is not None:
        (root / "text.txt").write_text(text)
    return root / name


class OrtDecoder:
    """An LLM folder's decoder on ONNX Runtime (as deployed: its optimizations on), cache carried
    along."""

    def __init__(self, folder: Path):
        self.config = read_config(folder)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        self.sess = ort.InferenceSession(str(Path(folder) / MODEL_FILE), so)
        c = self.config
        self.outputs = ["logits"] + [n for i in range(c.num_layers) for n in present_names(i)]

    def empty(self, batch: int, room: int = 0) -> dict[str, np.ndarray]:
        """An empty cache; ``room``: fed straight to a step of that many tokens (``past_feed``)."""
        c = self.config
        empty = np.zeros((batch, c.num_kv_heads, 0, c.head_dim), np.float32)
        past = past_feed(c.kv_layout, empty, room) if room else empty
        return {n: past for i in range(c.num_layers) for n in past_names(i)}

    def step(self, ids, mask, positions, cache):
        room = {n: past_feed(self.config.kv_layout, a, ids.shape[1]) for n, a in cache.items()}
        out = self.sess.run(
            self.outputs,
            {"input_ids": ids, "attention_mask": mask, "position_ids": positions, **room},
        )
        c = self.config
        new = {}
        for i in range(c.num_layers):
            (pk, pv), (k, v) = past_names(i), (2 * i + 1, 2 * i + 2)
            new[pk], new[pv] = out[k], out[v]
        return out[0], new

    def greedy(self, prompt: list[int], steps: int) -> list[int]:
        """Greedy tokens after ``prompt``: ``steps`` of them, or fewer when one is EOS."""
        n = len(prompt)
        logits, cache = self.step(
            np.array([prompt], np.int64),
            np.ones((1, n), np.int64),
            np.arange(n, dtype=np.int64)[None],
            self.empty(1),
        )
        out: list[int] = []
        while True:
            token = int(logits[0, -1].argmax())
            out.append(token)
            if token in self.config.eos_token_ids or len(out) == steps:
                return out
            total = n + len(out)
            again = self.config.prefill_again_after
            if again is not None and total > again >= total - 1:
                # the rope changes here (Phi-3 longrope): run the whole sequence again
                seq = prompt + out
                logits, cache = self.step(
                    np.array([seq], np.int64),
                    np.ones((1, total), np.int64),
                    np.arange(total, dtype=np.int64)[None],
                    self.empty(1),
                )
                continue
            logits, cache = self.step(
                np.array([[token]], np.int64),
                np.ones((1, total), np.int64),
                np.array([[total - 1]], np.int64),
                cache,
            )

    def logits(self, prompt: list[int]) -> np.ndarray:
        n = len(prompt)
        logits, _ = self.step(
            np.array([prompt], np.int64),
            np.ones((1, n), np.int64),
            np.arange(n, dtype=np.int64)[None],
            self.empty(1),
        )
        return logits[0]


def hf_greedy(model, prompt: list[int], steps: int, eos: tuple[int, ...]) -> list[int]:
    """transformers' greedy tokens (``generate(do_sample=False)``), stopping at EOS like ours."""
    import torch

    ids = torch.tensor([prompt])
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=steps,
            do_sample=False,
            eos_token_id=list(eos) or None,
            pad_token_id=eos[0] if eos else 0,
        )
    return out[0, len(prompt) :].tolist()


def hf_logits(model, prompt: list[int]) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(torch.tensor([prompt])).logits[0].float().numpy()


def encode(folder: Path, text: str) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str((Path(folder) / "tokenizer.json").read_text())
    return tok.encode(text, add_special_tokens=False).ids


def folder_files(folder: Path) -> dict:
    return (
        {p.name: p.stat().st_size for p in Path(folder).iterdir()} if Path(folder).exists() else {}
    )


__all__ = ["OrtDecoder", "encode", "folder_files", "hf_greedy", "hf_logits", "json"]
