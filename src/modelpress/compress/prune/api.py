"""``prune()``: structured, unstructured or 2:4 pruning of any ONNX model, fine-tuned on the data.

Structured (``ratio``): the dependency groups of the graph are found (``depgraph``), their
components scored (``importance``; by default how much each adds to the layers that read it,
measured on batches of the data, or on generated inputs without data), the fraction ``ratio`` of
each group removed physically (``surgery``), in one shot or in ``rounds`` rounds with fine-tuning
after each. Unstructured (``sparsity``, ``pattern``): magnitude masks, kept through fine-tuning.
Fine-tuning trains on the labels when the data has them and against the original model as teacher
(always, when it has none); ``train=None`` with data uses a short default schedule, ``train=False`` skips it.

The result is checked: the pruned model must run under ONNX Runtime, and on the held-out samples
its accuracy (with labels), its top-1 agreement and output cosine with the original are reported.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.compress.prune import calibration as calib
from modelpress.compress.prune import structured
from modelpress.compress.prune import unstructured as unstr
from modelpress.compress.prune.importance import METHODS, taylor_terms
from modelpress.compress.train import TeacherLoss, TrainConfig, TrainData, TrainResult
from modelpress.compress.train.batchnorm import recalibrate
from modelpress.compress.train.finetune import finetune
from modelpress.compress.train.results import result_dict
from modelpress.errors import InputError, OptionError, renamed
from modelpress.ir.feeds import as_model
from modelpress.ir.graph import copy_model
from modelpress.ir.io import model_bytes
from modelpress.runtime.ort import session
from modelpress.verify import generate_inputs
from modelpress.verify.metrics import Comparison, compare

# stage, step, total, loss
Progress = Callable[[str, int, int, float | None], None]
DEFAULT_TRAINING = TrainConfig(epochs=2, lr=3e-3)
CALIBRATION = (1024, 16)  # at most this many samples, in batches of this size, for calibration
METADATA_KEY = "modelpress.sparsity"


@dataclass
class PruneResult:
    model: ir.Model
    kind: str  # structured, unstructured, 2:4
    importance: str | None
    params_before: int
    params_after: int
    size_before: int
    size_after: int
    seconds: float
    sparsity: float | None = None  # unstructured and 2:4: zeros among the prunable weights
    rounds: list[dict] = field(default_factory=list)  # one report per pruning round
    training: list[TrainResult] = field(default_factory=list)
    check: Comparison | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return result_dict(self)


def param_count(model: ir.Model) -> int:
    return sum(
        int(np.prod(v.const_value.shape))
        for v in model.graph.initializers.values()
        if v.const_value is not None
    )


def _training_progress(progress: Progress | None, stage: str):
    if progress is None:
        return None
    return lambda step, total, loss: progress(stage, step, total, loss)


def prune(
    model,
    *,
    data=None,
    labels_key: str | None = None,
    image=None,
    limit: int | None = None,
    ratio: float | None = None,
    head_ratio: float | None = None,
    sparsity: float | None = None,
    pattern: str = "unstructured",
    scope: str = "global",
    importance: str = "activation",
    rounds: int | None = None,
    keep: list[str] | tuple[str, ...] = (),
    round_to: int = 1,
    global_ranking: bool = False,
    refit: bool = False,
    train: TrainConfig | bool | None = None,
    alpha: float | None = None,
    temperature: float = 1.0,
    soft: str = "auto",
    recalibrate_bn: bool = True,
    progress: Progress | None = None,
    steps: int | None = None,
) -> PruneResult:
    """Prune ``model`` (see the module docstring). Give ``ratio`` (structured; ``head_ratio`` for
    attention heads), or ``sparsity`` / ``pattern="2:4"`` (unstructured). ``refit``: before the
    removal, refit the layers that read removed neurons and heads by least squares on the data
    (``refit.py``). ``rounds`` (1): prune in that many rounds, fine-tuning after each (``steps``:
    its old name)."""
    rounds = renamed(rounds, steps, new="rounds", old="steps")
    rounds = 1 if rounds is None else rounds
    started = time.perf_counter()
    original = as_model(model)
    structured_mode = ratio is not None or head_ratio is not None
    if structured_mode and (sparsity is not None or pattern == "2:4"):
        raise OptionError(
            "choose structured pruning (ratio) or unstructured (sparsity, 2:4), not both"
        )
    if not structured_mode and sparsity is None and pattern != "2:4":
        raise OptionError(
            "nothing to prune: give a ratio (structured), a sparsity, or the 2:4 pattern"
        )
    if importance not in METHODS + calib.METHODS:
        raise OptionError(
            f"importance {importance!r}: choose one of {', '.join(METHODS + calib.METHODS)}"
        )
    if rounds < 1:
        raise OptionError(f"`rounds` {rounds}: at least 1")
    keep_set = frozenset(keep)
    names = {n.name for n in original.graph}
    unknown = sorted(keep_set - names)
    if unknown:
        raise OptionError(f"keep: no node named {unknown[0]!r} in the model")
    dataset = (
        TrainData.load(data, original, labels_key=labels_key, image=image, limit=limit)
        if data is not None
        else None
    )
    config = _config(train, dataset, importance)
    loss = TeacherLoss(soft=soft, alpha=alpha, temperature=temperature)
    train_part, held = (
        dataset.split(config.val_fraction, seed=config.seed)
        if dataset is not None and config
        else (dataset, None)
    )
    if importance == "taylor" and dataset is None:
        raise OptionError("taylor importance needs training data (the gradients of its loss)")
    if (importance in calib.METHODS or refit) and dataset is None:
        raise OptionError(
            f"{'refit' if refit else importance + ' importance'} needs training data (samples to measure on)"
        )
    feeds = dataset.sample(2) if dataset is not None else _generated(original)
    calibration = _calibration(train_part) if train_part is not None else None
    result = PruneResult(
        model=original,
        kind="structured" if structured_mode else ("2:4" if pattern == "2:4" else "unstructured"),
        importance=importance if structured_mode else None,
        params_before=param_count(original),
        params_after=0,
        size_before=len(model_bytes(original)),
        size_after=0,
        seconds=0.0,
    )
    current = original

    def tune(model: ir.Model, stage: str, prepare=None) -> ir.Model:
        """Fine-tune ``model`` on the training part, the original as teacher (the one way every
        pruning stage trains); its training result joins the result's."""
        tuned, tr = finetune(
            model,
            train_part,
            teacher=original,
            config=config,
            loss=loss,
            held_out=held,
            prepare=prepare,
            progress=_training_progress(progress, stage),
        )
        result.training.append(tr)
        return tuned

    if structured_mode:
        r = ratio if ratio is not None else 0.0
        hr = head_ratio
        for i in range(1, rounds + 1):
            step_r = _step_ratio(r, i, rounds)
            step_h = _step_ratio(hr, i, rounds) if hr is not None else None
            taylor = None
            if importance == "taylor":
                taylor = _taylor(current, original, train_part, config or DEFAULT_TRAINING, loss)
            if progress:
                progress(f"pruning {i}/{rounds}", 0, 0, None)
            current, report = structured.prune_step(
                current,
                feeds,
                ratio=step_r,
                head_ratio=step_h,
                method=importance,
                keep=list(keep_set),
                round_to=round_to,
                global_ranking=global_ranking,
                taylor=taylor,
                calibration=calibration,
                refit=refit,
            )
            result.rounds.append(report.to_dict())
            _check_runs(current, feeds)
            if recalibrate_bn and train_part is not None:
                recalibrate(current, train_part)
            if config:
                current = tune(current, f"fine-tuning {i}/{rounds}")
        if importance == "activation" and dataset is None:
            result.notes.append(
                "activation importance was measured on generated inputs: give data for scores that follow real inputs"
            )
        if all(s["removed_units"] == 0 for s in result.rounds):
            result.notes.append(
                "no unit could be removed: every group is blocked (outputs, unknown ops) or kept"
            )
    else:
        current = copy_model(original)
        masks, dense = unstr.masks(
            current, sparsity=sparsity or 0.0, pattern=pattern, scope=scope, keep=keep_set
        )
        unstr.apply_masks(current, masks)
        if dense:
            result.notes.append(
                f"{len(dense)} weight(s) stay dense: their reduction length is not a multiple of 4 ({', '.join(dense[:3])}{'...' if len(dense) > 3 else ''})"
            )
        if config:
            current = tune(current, "fine-tuning", lambda m: unstr.mask_module(m, masks))
        result.sparsity = unstr.sparsity_of(current)
        current.metadata_props[METADATA_KEY] = json.dumps(
            {
                "pattern": pattern,
                "sparsity": round(result.sparsity, 4),
                "scope": scope if pattern != "2:4" else "2:4",
            }
        )
    _check_runs(current, feeds)
    result.model = current
    result.params_after = param_count(current)
    result.size_after = len(model_bytes(current))
    check_data = held if held is not None else dataset
    if check_data is not None:
        result.check = compare(original, current, check_data)
    result.seconds = time.perf_counter() - started
    return result


def _config(train, dataset: TrainData | None, importance: str) -> TrainConfig | None:
    if train is False or dataset is None:
        if isinstance(train, TrainConfig) and dataset is None:
            raise OptionError("fine-tuning needs training data")
        return None
    return train if isinstance(train, TrainConfig) else DEFAULT_TRAINING


def _step_ratio(ratio: float, i: int, rounds: int) -> float:
    """The ratio of step ``i`` that takes the kept fraction linearly from 1 to ``1 - ratio``."""
    keep_prev = 1 - ratio * (i - 1) / rounds
    keep_now = 1 - ratio * i / rounds
    return 1 - keep_now / keep_prev


def _calibration(data: TrainData) -> list:
    """Up to ``CALIBRATION`` samples of ``data``, shuffled (seed 0), in batches."""
    n, size = CALIBRATION
    out, seen = [], 0
    for batch in data.batches(size, rng=np.random.default_rng(0)):
        if seen >= n:
            break
        out.append(batch)
        seen += len(next(iter(batch.feeds.values())))
    return out


def _generated(model: ir.Model) -> dict[str, np.ndarray]:

    return generate_inputs(model, dims={}, seed=0)


def _check_runs(model: ir.Model, feeds: dict[str, np.ndarray]) -> None:

    try:
        session(model, optimize="disabled").run(None, feeds)
    except Exception as exc:  # noqa: BLE001 - ORT's own exception classes
        raise InputError(
            f"the pruned model does not run ({str(exc).strip().splitlines()[0][:200]}); "
            "keep the layers involved whole (keep=...)"
        ) from None


def _taylor(
    model,
    original,
    data: TrainData,
    config: TrainConfig,
    loss: TeacherLoss,
    batches: int = 8,
):
    from modelpress.compress.train.finetune import teacher_objective
    from modelpress.compress.train.loop import batch_loss

    objective = teacher_objective(model, data, original, loss=loss)
    rng = np.random.default_rng(config.seed)
    chosen = []
    for batch in data.batches(config.batch_size, rng=rng):
        chosen.append(batch)
        if len(chosen) >= batches:
            break
    return taylor_terms(model, chosen, lambda module, batch: batch_loss(module, objective, batch))
