"""The one training loop: every method that trains (pruning's fine-tuning, distillation, QAT, Deep
Compression's retraining) goes through ``fit``.

``fit(module, data, objective, config)`` runs ``config.steps`` optimizer steps (or
``config.epochs`` passes over the data) with Adam, AdamW or SGD (momentum 0.9) under a constant,
cosine or linear-decay schedule after a short warm-up; it evaluates the objective on the held-out
part (``config.val_fraction`` of the samples, split off once) every ``eval_every`` steps, keeps the
weights of the best evaluation and stops after ``patience`` evaluations without improvement. With
no held-out part the final weights are kept. ``after_step`` runs after every optimizer step (masks
re-applied, codebooks tied); ``progress(step, total, loss)`` reports the running loss.

The result's ``curve`` (train loss, mean over each evaluation interval) and ``val`` (held-out loss)
go into the command's record: the loss curve the HTML report plots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from modelpress.compress.train.data import Batch, TrainData
from modelpress.errors import OptionError

OPTIMIZERS = ("adam", "adamw", "sgd")
SCHEDULES = ("cosine", "linear", "constant")
Progress = Callable[[int, int, float], None]


@dataclass(frozen=True)
class TrainConfig:
    """How to train. ``steps`` wins over ``epochs`` when both are given."""

    epochs: int | None = None
    steps: int | None = None
    batch_size: int = 32
    lr: float = 1e-3
    optimizer: str = "adam"
    schedule: str = "cosine"
    warmup: float = 0.05  # fraction of the steps with a linearly rising learning rate
    weight_decay: float = 0.0
    val_fraction: float = 0.1
    eval_every: int | None = None  # steps between held-out evaluations (default: 10 per run)
    patience: int | None = None  # evaluations without improvement before stopping
    grad_clip: float | None = 5.0
    seed: int = 0

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise OptionError(
                f"optimizer {self.optimizer!r}: choose one of {', '.join(OPTIMIZERS)}"
            )
        if self.schedule not in SCHEDULES:
            raise OptionError(f"schedule {self.schedule!r}: choose one of {', '.join(SCHEDULES)}")
        for name in ("epochs", "steps", "batch_size", "eval_every", "patience"):
            v = getattr(self, name)
            if v is not None and v < (0 if name in ("epochs", "steps") else 1):
                raise OptionError(
                    f"{name.replace('_', ' ')} {v}: must be at least {0 if name in ('epochs', 'steps') else 1}"
                )
        if self.lr <= 0:
            raise OptionError(f"learning rate {self.lr}: must be positive")

    def total_steps(self, data: TrainData) -> int:
        if self.steps is not None:
            return self.steps
        return (self.epochs if self.epochs is not None else 1) * data.batch_count(self.batch_size)


@dataclass
class TrainResult:
    steps: int
    seconds: float
    samples: int  # training samples (after the held-out split)
    held_out: int
    curve: list[dict] = field(
        default_factory=list
    )  # {"step", "loss"}: mean train loss per interval
    val: list[dict] = field(default_factory=list)  # {"step", "loss"}: held-out loss
    best_step: int | None = None
    stopped_early: bool = False
    first_loss: float | None = None  # the held-out (else train) loss before any step
    final_loss: float | None = None  # the held-out (else train) loss of the weights kept
    # the budget's measure as deployed (ONNX Runtime, held out) before and after training, and
    # whether the model before training was kept because training made it worse (``finetune``)
    score_before: float | None = None
    score_after: float | None = None
    fell_back: bool = False

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "seconds": round(self.seconds, 3),
            "samples": self.samples,
            "held_out": self.held_out,
            "first_loss": self.first_loss,
            "final_loss": self.final_loss,
            "best_step": self.best_step,
            "stopped_early": self.stopped_early,
            "score_before": self.score_before,
            "score_after": self.score_after,
            "fell_back": self.fell_back,
            "curve": self.curve,
            "val": self.val,
        }


def to_tensors(feeds: dict[str, np.ndarray], device) -> dict[str, torch.Tensor]:
    from modelpress.runtime.torch_backend.registry import from_numpy

    return {k: from_numpy(np.ascontiguousarray(v)).to(device) for k, v in feeds.items()}


def _labels(batch: Batch, device) -> torch.Tensor | None:
    return (
        None
        if batch.labels is None
        else torch.from_numpy(np.ascontiguousarray(batch.labels)).to(device)
    )


def batch_loss(module: nn.Module, objective, batch: Batch, device="cpu") -> torch.Tensor:
    feeds = to_tensors(batch.feeds, device)
    return objective(module(**feeds), feeds, _labels(batch, device))


def evaluate(
    module: nn.Module, objective, data: TrainData, *, batch_size: int, device="cpu"
) -> float:
    """The mean objective over ``data`` (weighted by batch size), without gradients."""
    total, n = 0.0, 0
    with torch.no_grad():
        for batch in data.batches(batch_size):
            k = len(next(iter(batch.feeds.values())))
            total += float(batch_loss(module, objective, batch, device)) * k
            n += k
    return total / max(n, 1)


def _optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)
    cls = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.Adam
    return cls(params, lr=config.lr, weight_decay=config.weight_decay)


def _lr_factor(step: int, total: int, config: TrainConfig) -> float:
    warm = int(config.warmup * total)
    if step < warm:
        return (step + 1) / warm
    if config.schedule == "constant" or total <= warm:
        return 1.0
    t = (step - warm) / max(1, total - warm)
    return 0.5 * (1 + math.cos(math.pi * t)) if config.schedule == "cosine" else 1.0 - t


def fit(
    module: nn.Module,
    data: TrainData,
    objective,
    config: TrainConfig,
    *,
    params: list[nn.Parameter] | None = None,
    held_out: TrainData | None = None,
    after_step: Callable[[], None] | None = None,
    progress: Progress | None = None,
    device="cpu",
) -> TrainResult:
    """Train ``module``'s parameters (or ``params``) on ``data`` to lower ``objective``.

    ``data`` is split into train and held-out parts by ``config.val_fraction`` unless
    ``held_out`` is given. Returns the loss curve; ``module`` holds the weights kept.
    """
    started = time.perf_counter()
    if held_out is None:
        train, held_out = data.split(config.val_fraction, seed=config.seed)
    else:
        train = data
    trainable = [
        p for p in (params if params is not None else module.parameters()) if p.requires_grad
    ]
    extra = [p for p in getattr(objective, "parameters", list)() if p.requires_grad]
    total = config.total_steps(train)
    result = TrainResult(
        steps=0, seconds=0.0, samples=len(train), held_out=len(held_out) if held_out else 0
    )
    module.train()
    if held_out is not None:
        module.eval()
        result.first_loss = evaluate(
            module, objective, held_out, batch_size=config.batch_size, device=device
        )
        result.val.append({"step": 0, "loss": result.first_loss})
        module.train()
    if total == 0 or not trainable:
        result.final_loss = result.first_loss
        result.seconds = time.perf_counter() - started
        module.eval()
        return result
    opt = _optimizer(trainable + extra, config)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: _lr_factor(s, total, config))
    every = config.eval_every or max(1, total // 10)
    rng = np.random.default_rng(config.seed)
    torch.manual_seed(config.seed)
    best = (result.first_loss, 0, _snapshot(module)) if held_out is not None else None
    window: list[float] = []
    bad_evals = 0
    step = 0
    while step < total:
        for batch in train.batches(config.batch_size, rng=rng):
            opt.zero_grad(set_to_none=True)
            loss = batch_loss(module, objective, batch, device)
            if not torch.isfinite(loss):
                raise OptionError(
                    f"the training loss became {float(loss)} at step {step}: lower the learning rate"
                )
            loss.backward()
            if config.grad_clip:
                torch.nn.utils.clip_grad_norm_(trainable + extra, config.grad_clip)
            opt.step()
            sched.step()
            if after_step is not None:
                with torch.no_grad():
                    after_step()
            step += 1
            value = float(loss.detach())
            if result.first_loss is None:
                result.first_loss = value
            window.append(value)
            if progress:
                progress(step, total, value)
            if step % every == 0 or step == total:
                result.curve.append({"step": step, "loss": float(np.mean(window))})
                window = []
                if held_out is not None:
                    module.eval()
                    val = evaluate(
                        module, objective, held_out, batch_size=config.batch_size, device=device
                    )
                    module.train()
                    result.val.append({"step": step, "loss": val})
                    if val < best[0]:
                        best, bad_evals = (val, step, _snapshot(module)), 0
                    else:
                        bad_evals += 1
                        if config.patience is not None and bad_evals >= config.patience:
                            result.stopped_early = True
                            break
            if step >= total:
                break
        if result.stopped_early:
            break
    result.steps = step
    if best is not None:
        _restore(module, best[2])
        result.final_loss, result.best_step = best[0], best[1]
    else:
        result.final_loss = result.curve[-1]["loss"] if result.curve else None
        result.best_step = step
    module.eval()
    result.seconds = time.perf_counter() - started
    return result


def _snapshot(module: nn.Module) -> dict[str, torch.Tensor]:
    # parametrized weights keep their originals under parametrizations.*.original: state_dict has them
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _restore(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    module.load_state_dict(state)
