"""The one training loop on the PyTorch backend, shared by pruning, distillation, QAT and Deep
Compression: training data (``TrainData``), what is minimized (``build_objective``), the loop
(``fit`` with a ``TrainConfig``), and ONNX models as trainable modules (``trainable``, ``export``).

Importing this package needs torch (the ``torch`` extra).
"""

from modelpress.errors import require

require("torch", extra="torch", purpose="training (pruning, distillation, QAT, Deep Compression)")

from modelpress.compress.train.data import Batch, TrainData  # noqa: E402
from modelpress.compress.train.loop import TrainConfig, TrainResult, evaluate, fit  # noqa: E402
from modelpress.compress.train.module import export, teacher, trainable  # noqa: E402
from modelpress.compress.train.objective import (  # noqa: E402
    FeaturePair,
    Objective,
    TeacherLoss,
    build_objective,
)

__all__ = [
    "Batch",
    "FeaturePair",
    "Objective",
    "TrainConfig",
    "TrainData",
    "TeacherLoss",
    "TrainResult",
    "build_objective",
    "evaluate",
    "export",
    "fit",
    "teacher",
    "trainable",
]
