"""Knowledge distillation: a student trained on a teacher's soft outputs (and labels, and matched
hidden states); the student given as a file or made by width reduction of the teacher."""

from modelpress.compress.distill.api import DistillResult, distill

__all__ = ["DistillResult", "distill"]
