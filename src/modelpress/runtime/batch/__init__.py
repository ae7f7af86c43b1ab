"""Batch inference: a model over a folder of images, a .jsonl of texts or an .npz, with
pre-processing in worker processes overlapping the model, resumable after a kill, on Ray Data
past one machine (``run.run_batch``)."""

from modelpress.runtime.batch.run import BatchResult, refuse_overwrite, run_batch
from modelpress.runtime.batch.split import BatchRule, batch_rule

__all__ = ["BatchResult", "BatchRule", "batch_rule", "refuse_overwrite", "run_batch"]
