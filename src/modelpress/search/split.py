"""Labelled data split in two: a validation part that judges every candidate, the rest trains.

A candidate that trains (structured pruning with fine-tuning, QAT, distillation) and is scored on
samples it trained on looks better than it is; so with labels and no separate training data,
``auto`` holds out a validation part of ``data`` and gives training candidates (and calibration)
only the rest.

Rule: ``fraction`` of the samples go to validation, drawn with ``numpy.random.default_rng(seed)``
(the same data and seed give the same split on every machine). When the labels are classes (one
integer per sample) the split is stratified: each class sends ``round(fraction × its count)`` of
its samples to validation (at least one to each part when it has two or more), so both parts keep
the data's class balance. Other labels (floats, sequences, several per sample) are split at
random. No split when either part would hold fewer than ``min_part`` samples: training on a
handful of samples cannot be judged, and the search stays post-training (the caller says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelpress.errors import OptionError
from modelpress.ir.files import write_npz

VALIDATION_FRACTION = 0.5  # of labelled data, the part that scores every candidate
MIN_PART = 64  # fewer samples than this in either part: no split, no training candidates


@dataclass(frozen=True)
class Split:
    train: np.ndarray  # sample indices, sorted
    validation: np.ndarray  # sample indices, sorted
    seed: int
    fraction: float
    stratified: bool
    classes: int  # distinct labels (0 when not stratified)

    def to_dict(self) -> dict:
        return {
            "validation_fraction": self.fraction,
            "seed": self.seed,
            "stratified": self.stratified,
            "classes": self.classes,
            "train_samples": int(len(self.train)),
            "validation_samples": int(len(self.validation)),
        }


def is_classes(labels: np.ndarray) -> bool:
    """One integer label per sample (class indices): a split keeps their balance."""
    return labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer)


def holdout_split(
    labels: np.ndarray,
    *,
    fraction: float = VALIDATION_FRACTION,
    seed: int = 0,
    min_part: int = MIN_PART,
) -> Split | None:
    """The split of ``len(labels)`` samples (module rule); None when a part would be too small."""
    if not 0 < fraction < 1:
        raise OptionError(f"`validation_fraction` {fraction}: give a fraction between 0 and 1")
    labels = np.asarray(labels)
    n = len(labels)
    rng = np.random.default_rng(seed)
    stratified = is_classes(labels)
    if stratified:
        held = []
        classes = np.unique(labels)
        for c in classes:
            idx = rng.permutation(np.flatnonzero(labels == c))
            k = int(round(fraction * len(idx)))
            if len(idx) >= 2:
                k = min(max(k, 1), len(idx) - 1)
            held.append(idx[:k])
        validation = np.sort(np.concatenate(held)) if held else np.zeros(0, dtype=np.int64)
    else:
        classes = ()
        validation = np.sort(rng.permutation(n)[: int(round(fraction * n))])
    train = np.setdiff1d(np.arange(n), validation)
    if min(len(train), len(validation)) < min_part:
        return None
    return Split(train, validation, seed, fraction, stratified, len(classes))


def write_parts(arrays: dict[str, np.ndarray], split: Split, folder: Path) -> tuple[str, str]:
    """The validation and the training part of ``arrays`` as two .npz files in ``folder`` (every
    array with one row per sample is cut; others are copied whole)."""
    n = len(split.train) + len(split.validation)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, idx in (("validation", split.validation), ("train", split.train)):
        path = folder / f"{name}.npz"
        write_npz(path, {k: (a[idx] if a.ndim and len(a) == n else a) for k, a in arrays.items()})
        paths.append(str(path))
    return paths[0], paths[1]


__all__ = ["MIN_PART", "VALIDATION_FRACTION", "Split", "holdout_split", "is_classes", "write_parts"]
