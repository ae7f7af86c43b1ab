"""What training minimizes: the hard loss on labels, the soft loss against a teacher, features.

``Objective(student_outputs, batch)`` returns the loss of one batch:

    loss = alpha * soft + (1 - alpha) * hard + feature_weight * features

- *hard* (labels given): cross-entropy for integer labels (class axis 1, torch's convention), mean
  squared error for float targets, on the model's first output;
- *soft* (a teacher given): on every float output the teacher and student share, ``kl`` (the KL
  divergence of the student's softened distribution from the teacher's at temperature T, times T²
  so that its gradients keep their size as T changes: Hinton et al., 2015), ``mse`` or ``cosine``
  (one minus the cosine along the last axis). ``auto`` picks ``kl`` for outputs that are logits
  (a 2-D output made by Gemm/MatMul, possibly plus a bias) and ``mse`` otherwise (embeddings,
  regression, feature maps);
- *features*: mean squared error between matched intermediate values (a student hidden state and
  the teacher's at the corresponding layer), through a learned linear map when widths differ.

Without labels only the soft loss is used; without a teacher only the hard loss: so a user with
only unlabeled inputs trains against the original model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir
import torch
import torch.nn.functional as F
from torch import nn

from modelpress.errors import InputError, OptionError
from modelpress.verify.metrics import output_is_logits

SOFT_LOSSES = ("auto", "kl", "mse", "cosine")


@dataclass(frozen=True)
class TeacherLoss:
    """The loss against a teacher's outputs and its mix with the labels' hard loss: ``soft``, one
    of ``SOFT_LOSSES``, at ``temperature``, weighed by ``alpha`` when labels exist too (None: 0.5).
    What pruning, distillation and Deep Compression all take from their callers."""

    soft: str = "auto"
    alpha: float | None = None
    temperature: float = 1.0


def _soft(kind: str, s: torch.Tensor, t: torch.Tensor, temperature: float) -> torch.Tensor:
    if kind == "kl":
        axis = 1 if s.dim() > 1 else 0
        log_p = F.log_softmax(s / temperature, dim=axis)
        log_q = F.log_softmax(t / temperature, dim=axis)
        # batchmean KL(q || p), as Hinton et al.: the teacher's distribution is the target
        kl = (log_q.exp() * (log_q - log_p)).sum(dim=axis)
        return kl.mean() * temperature**2
    if kind == "mse":
        return F.mse_loss(s, t)
    if kind == "cosine":
        return (
            1
            - F.cosine_similarity(
                s.flatten(1) if s.dim() > 2 else s, t.flatten(1) if t.dim() > 2 else t, dim=-1
            )
        ).mean()
    raise OptionError(f"soft loss {kind!r}: choose one of {', '.join(SOFT_LOSSES)}")


def hard_loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy for integer labels, mean squared error for float targets."""
    if labels.dtype.is_floating_point:
        if labels.shape != out.shape:
            raise InputError(
                f"labels of shape {list(labels.shape)} do not match the output's {list(out.shape)}"
            )
        return F.mse_loss(out, labels.to(out.dtype))
    if out.dim() < 2 or labels.shape != out.shape[:1] + out.shape[2:]:
        raise InputError(
            f"integer labels of shape {list(labels.shape)} do not fit the output's {list(out.shape)} "
            "(class scores on axis 1, one label per sample)"
        )
    classes = out.shape[1]
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise InputError(
            f"labels must be class indices in [0, {classes}); found {int(labels.min())}..{int(labels.max())}"
        )
    return F.cross_entropy(out, labels.long())


@dataclass
class FeaturePair:
    """A student value matched with a teacher value (both added as extra outputs)."""

    student: str
    teacher: str
    projection: nn.Module | None = None


@dataclass
class Objective:
    """The loss of a batch (see the module docstring). ``teacher`` is a frozen module returning the
    teacher's outputs then its matched features; the student returns its outputs then features."""

    outputs: int  # the model's own outputs (features follow them)
    soft: list[str] = field(
        default_factory=list
    )  # per output: kl, mse, cosine or "" (no soft loss)
    hard: bool = False
    alpha: float = 0.5
    temperature: float = 1.0
    teacher: nn.Module | None = None
    features: list[FeaturePair] = field(default_factory=list)
    feature_weight: float = 1.0

    def parameters(self) -> list[nn.Parameter]:
        """Parameters the objective itself trains (feature projections)."""
        return [
            p for f in self.features if f.projection is not None for p in f.projection.parameters()
        ]

    def __call__(
        self, student_out, feeds: dict[str, torch.Tensor], labels: torch.Tensor | None
    ) -> torch.Tensor:
        s = student_out if isinstance(student_out, tuple) else (student_out,)
        uses_soft = self.teacher is not None and any(self.soft)
        uses_hard = self.hard and labels is not None
        t = None
        if self.teacher is not None and (uses_soft or self.features):
            with torch.no_grad():
                t = self.teacher(**feeds)
            t = t if isinstance(t, tuple) else (t,)
        total = s[0].new_zeros(())
        if uses_soft:
            terms = [
                _soft(k, s[i].float(), t[i].float(), self.temperature)
                for i, k in enumerate(self.soft)
                if k
            ]
            soft = sum(terms) / len(terms)
            total = total + (self.alpha if uses_hard else 1.0) * soft
        if uses_hard:
            total = total + ((1 - self.alpha) if uses_soft else 1.0) * hard_loss(s[0], labels)
        if self.features and t is not None:
            feats = []
            for k, pair in enumerate(self.features):
                sv, tv = s[self.outputs + k], t[self.outputs + k]
                if pair.projection is not None:
                    sv = pair.projection(sv)
                feats.append(F.mse_loss(sv.float(), tv.float()))
            total = total + self.feature_weight * sum(feats) / len(feats)
        return total


def build_objective(
    model: ir.Model,
    *,
    labels: bool,
    teacher: nn.Module | None,
    loss: TeacherLoss | None = None,
    features: list[FeaturePair] | None = None,
    feature_weight: float = 1.0,
) -> Objective:
    """The objective for a model with these data: labels, a teacher, or both.

    ``loss.alpha`` weighs the soft loss when both exist (default 0.5); 0 trains on labels alone,
    1 on the teacher alone. Raises ``InputError`` when neither labels nor a teacher are given.
    """
    loss = loss or TeacherLoss()
    soft, temperature = loss.soft, loss.temperature
    if soft not in SOFT_LOSSES:
        raise OptionError(f"soft loss {soft!r}: choose one of {', '.join(SOFT_LOSSES)}")
    if temperature <= 0:
        raise OptionError(f"temperature {temperature}: must be positive")
    n_out = len(model.graph.outputs)
    kinds = []
    for i, v in enumerate(model.graph.outputs):
        floating = v.dtype in (
            ir.DataType.FLOAT,
            ir.DataType.FLOAT16,
            ir.DataType.DOUBLE,
            ir.DataType.BFLOAT16,
            None,
        )
        if not floating:
            kinds.append("")
        elif soft == "auto":
            kinds.append("kl" if output_is_logits(model, i) else "mse")
        else:
            kinds.append(soft)
    a = 0.5 if loss.alpha is None else float(loss.alpha)
    if not 0 <= a <= 1:
        raise OptionError(f"alpha {a}: the soft loss's weight is in [0, 1]")
    use_teacher = teacher is not None and (not labels or a > 0)
    if not labels and not use_teacher:
        raise InputError(
            "training needs labels or a teacher: give the labels key, or train against the original model"
        )
    return Objective(
        outputs=n_out,
        soft=kinds if use_teacher else [],
        hard=labels and (not use_teacher or a < 1),
        alpha=a,
        temperature=temperature,
        teacher=teacher if use_teacher or features else None,
        features=list(features or []),
        feature_weight=feature_weight,
    )
