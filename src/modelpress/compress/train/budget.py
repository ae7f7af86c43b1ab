"""What a trained result must keep of the original, judged as it will be deployed.

A compression step that trains (prune, distill, Deep Compression) is checked on held-out samples
with ONNX Runtime (``metrics.compare``): the model it writes against the model it started from.
The budget reads one measure, the most telling one the check has:

1. with integer labels and class scores: the top-1 accuracy may drop by ``max_accuracy_drop``;
2. class scores without labels: top-1 agreement with the original at least ``min_agreement``;
3. any other float output (embeddings, boxes, regressions): mean cosine at least ``min_cosine``.

``score`` is the same measure as one number (higher is better): the training step compares the
model before and after training by it, and keeps the better one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from modelpress.errors import OptionError
from modelpress.verify.metrics import Comparison


@dataclass(frozen=True)
class Budget:
    max_accuracy_drop: float = 0.02
    min_agreement: float = 0.90
    min_cosine: float = 0.90

    def __post_init__(self):
        for name in ("max_accuracy_drop", "min_agreement", "min_cosine"):
            v = getattr(self, name)
            if not 0 <= v <= 1:
                raise OptionError(f"`{name}` {v}: choose a value in [0, 1]")

    def failures(self, check: Comparison | None) -> list[str]:
        """Why the checked model is outside the budget (empty: within it, or nothing to check)."""
        if check is None:
            return []
        if check.accuracy_drop is not None:
            if check.accuracy_drop > self.max_accuracy_drop:
                return [
                    f"top-1 accuracy fell {check.accuracy_before:.2%} → {check.accuracy_after:.2%} "
                    f"on {check.samples} held-out samples, over the "
                    f"{self.max_accuracy_drop:.2%} allowed (`max_accuracy_drop`)"
                ]
            return []
        if check.agreement is not None:
            if check.agreement < self.min_agreement:
                return [
                    f"top-1 agreement with the original is {check.agreement:.2%} on "
                    f"{check.samples} held-out samples, under {self.min_agreement:.0%} "
                    "(`min_agreement`)"
                ]
            return []
        if check.cosine is not None and check.cosine < self.min_cosine:
            return [
                f"output cosine with the original is {check.cosine:.4f} on {check.samples} "
                f"held-out samples, under {self.min_cosine:g} (`min_cosine`)"
            ]
        return []

    def to_dict(self) -> dict:
        return asdict(self)


def score(check: Comparison | None) -> float | None:
    """The budget's measure as one number, higher is better (None: nothing measured)."""
    if check is None:
        return None
    if check.accuracy_after is not None:
        return check.accuracy_after
    if check.agreement is not None:
        return check.agreement
    return check.cosine
