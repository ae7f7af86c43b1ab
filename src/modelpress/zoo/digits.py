"""scikit-learn's digits data, shaped for the zoo's CNNs, and the short training loop they share.

The 8x8 images (values 0..16) are upsampled 4x by nearest neighbour to 1x32x32 float32 and
normalised with the training split's mean and standard deviation, so the CNNs see image-like
inputs of a realistic size while training stays within seconds on one core. The split is fixed
(stratified, seed 0): every caller sees the same train and test sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

IMAGE_SIZE = 32
NUM_CLASSES = 10
_SPLIT_SEED = 0
_TEST_FRACTION = 0.25


@dataclass(frozen=True)
class DigitsData:
    """Train and test arrays: images ``(N, 1, 32, 32)`` float32, labels ``(N,)`` int64."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    mean: float  # the normalisation applied to the 0..1 pixel values, for new images
    std: float


@lru_cache(maxsize=1)
def _load() -> DigitsData:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.float32) / 16.0  # (N, 8, 8) in 0..1
    scale = IMAGE_SIZE // images.shape[-1]
    images = np.kron(images, np.ones((1, scale, scale), dtype=np.float32))[:, None]
    labels = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=_TEST_FRACTION, random_state=_SPLIT_SEED, stratify=labels
    )
    mean = float(x_train.mean())
    std = float(x_train.std())
    for arr in (x_train, x_test):
        arr -= mean
        arr /= std
    return DigitsData(
        x_train=np.ascontiguousarray(x_train),
        y_train=y_train,
        x_test=np.ascontiguousarray(x_test),
        y_test=y_test,
        mean=mean,
        std=std,
    )


def digits_data() -> DigitsData:
    """The digits split (copies: callers may modify their arrays freely)."""
    d = _load()
    return DigitsData(
        x_train=d.x_train.copy(),
        y_train=d.y_train.copy(),
        x_test=d.x_test.copy(),
        y_test=d.y_test.copy(),
        mean=d.mean,
        std=d.std,
    )


def train_classifier(module, *, epochs: int, lr: float, seed: int, batch_size: int = 64):
    """Train ``module`` on the digits train split with Adam; deterministic for a given seed.

    Runs on one thread: besides being fair to a shared machine, a fixed reduction order makes the
    trained weights (and so the exported models) identical from run to run.
    """
    import torch

    data = _load()
    x = torch.from_numpy(data.x_train)
    y = torch.from_numpy(data.y_train)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(seed)
        opt = torch.optim.Adam(module.parameters(), lr=lr)
        steps = epochs * ((len(x) + batch_size - 1) // batch_size)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps)
        loss_fn = torch.nn.CrossEntropyLoss()
        module.train()
        for _ in range(epochs):
            order = torch.randperm(len(x), generator=gen)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                opt.zero_grad()
                loss = loss_fn(module(x[idx]), y[idx])
                loss.backward()
                opt.step()
                sched.step()
    finally:
        torch.set_num_threads(threads)
    module.eval()
    return module
