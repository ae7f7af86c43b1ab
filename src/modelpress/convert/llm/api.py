"""``convert_llm()``: a decoder checkpoint (Hugging Face folder or GGUF) in, a verified LLM folder out.

Read the checkpoint (``checkpoint``), find its family (``families``), build the ONNX decoder
(``builder``), stage the folder (``folder``), compare it with transformers (``verify``) and only then
move it into place. A decoder that does not verify is not written (unless ``verify=False``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from modelpress.convert.llm.builder import build_decoder
from modelpress.convert.llm.checkpoint import Checkpoint, read_checkpoint
from modelpress.convert.llm.families import Spec, family_of
from modelpress.convert.llm.folder import check_output, publish, staging_dir, write_staged
from modelpress.convert.llm.verify import DEFAULT_RTOL, DecoderCheck, check_decoder
from modelpress.errors import OptionError
from modelpress.ir.llm import MODEL_FILE, DecoderConfig

LEVELS = ("standard", "ort")
KV_LAYOUT = {"standard": "in_place", "ort": "left_aligned"}


@dataclass
class LLMConvertResult:
    output: Path
    config: DecoderConfig
    source_kind: str  # "hf" or "gguf"
    verify: DecoderCheck | None
    nodes: int = 0
    parameters: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "source_kind": self.source_kind,
            "output": str(self.output),
            "family": self.config.family,
            "level": self.config.level,
            "config": self.config.to_dict(),
            "nodes": self.nodes,
            "parameters": self.parameters,
            "verify": self.verify.to_dict() if self.verify else None,
            "notes": self.notes,
            "seconds": round(self.seconds, 3),
        }


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def decoder_config(spec: Spec, ckpt: Checkpoint, *, level: str) -> DecoderConfig:
    c, gen = ckpt.config, ckpt.generation
    eos = _ids(gen.get("eos_token_id")) or _ids(getattr(c, "eos_token_id", None))
    bos = gen.get("bos_token_id", getattr(c, "bos_token_id", None))
    pad = gen.get("pad_token_id", getattr(c, "pad_token_id", None))
    tok_config = ckpt.tokenizer.get("tokenizer_config.json", {})
    add_bos = (
        bool(tok_config.get("add_bos_token", False)) if isinstance(tok_config, dict) else False
    )
    return DecoderConfig(
        family=spec.family,
        num_layers=spec.num_layers,
        num_kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        vocab_size=spec.vocab_size,
        max_context=int(spec.max_context),
        eos_token_ids=eos,
        bos_token_id=None if bos is None else int(_ids(bos)[0]),
        pad_token_id=None if pad is None else int(_ids(pad)[0]),
        level=level,
        kv_layout=KV_LAYOUT[level],
        sliding_window=spec.sliding_window,
        add_bos_token=add_bos,
        prefill_again_after=_switch(spec),
        source=Path(ckpt.source).name,
    )


def _switch(spec: Spec) -> int | None:
    longs = [r.long_from for r in spec.rope if r.long_inv_freq is not None]
    return min(longs) if longs else None


def convert_llm(
    source: str | os.PathLike,
    *,
    output: str | os.PathLike,
    level: str = "standard",
    verify: bool = True,
    rtol: float | None = None,
    reference=None,
) -> LLMConvertResult:
    """Convert the decoder checkpoint at ``source`` into the LLM folder ``output``.

    ``level``: ``standard`` (ONNX ops only) or ``ort`` (ONNX Runtime's contrib ops; the cache is
    ``left_aligned``). ``rtol``: the logits' tolerance, relative to the
    largest reference logit (default 1e-4). ``reference``: a transformers model to compare with
    (default: loaded from ``source``).
    """
    start = time.perf_counter()
    if level not in LEVELS:
        raise OptionError(f"`level` {level!r}: expected one of {', '.join(LEVELS)}")
    out = Path(output)
    check_output(out)
    ckpt = read_checkpoint(source)
    family = family_of(ckpt.config, where=str(source))
    spec = family.spec(ckpt.config)
    weights = ckpt.weights
    model = build_decoder(
        spec,
        family.globals(weights, spec, ckpt.config),
        lambda i: family.layer(weights, spec, i),
        level=level,
    )
    config = decoder_config(spec, ckpt, level=level)
    nodes = len(model.graph.node)
    params = sum(_numel(t) for t in model.graph.initializer)
    check = None
    with staging_dir(out) as tmp:
        stage = tmp / out.name
        stage.mkdir()
        write_staged(stage, model, config, ckpt)
        del model
        if verify:
            check = check_decoder(
                stage / MODEL_FILE,
                config,
                ckpt,
                reference=reference,
                rtol=DEFAULT_RTOL if rtol is None else rtol,
            )
            check.raise_if_failed()
        publish(stage, out)
    return LLMConvertResult(
        output=out,
        config=config,
        source_kind=ckpt.kind,
        verify=check,
        nodes=nodes,
        parameters=params,
        seconds=time.perf_counter() - start,
    )


def _numel(t) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n
