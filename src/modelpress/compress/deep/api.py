"""``deep_compress()``: Deep Compression (Han et al., ICLR 2016) of any ONNX model to an ``.mpz``.

1. *Pruning*: the fraction ``sparsity`` of the smallest weights of Conv/Gemm/MatMul layers are
   removed (global magnitude ranking by default) and the network is retrained with them held at
   zero. The graph is then optimized (``optimize``, level 2: BatchNorm folded into the
   convolutions, Pads into them, constants folded, activation patterns fused), as a deployed model
   is: in a small network the normalizations and a graph's constant plumbing weigh as much as the
   pruned weights. Not before: BatchNorm, normalizing with each batch's statistics, is what lets
   the network recover from losing most of its weights (folded first, mobilenet-digits at 80%
   retrained to 59% instead of 96%, at 3e-3 for 2 epochs); folding keeps the zeros, as it scales
   whole output channels;
2. *Quantization by weight sharing*: each layer's remaining weights are clustered into
   ``2**bits`` shared values (k-means, linear initialization) and the codebooks are retrained at
   a tenth of the learning rate (``CODEBOOK_LR``);
   the codebooks and the other float tensors of more than one value (biases, ...) are rounded to
   float16 for this retraining, which trains through the rounding (``half``);
3. *Entropy coding*: the sparse positions, the codes and everything else are entropy coded
   (``mpz``).

The result holds the file's bytes and the size after each stage, as the paper reports them: the
optimized graph in float32, after pruning (32-bit values plus an 8-bit relative index per kept
weight), after sharing (``bits`` per weight plus the index, and 32-bit codebooks), and the file
itself; everything the stages do not touch (biases, the graph) counts at its float32 size in the
middle rows. The file is decoded again and must give the trained model exactly; the decoded model
is checked against the original on the held-out samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import onnx_ir as ir

from modelpress.compress.deep import half, kmeans, mpz
from modelpress.compress.prune import unstructured as unstr
from modelpress.compress.train import TeacherLoss, TrainConfig, TrainData, TrainResult
from modelpress.compress.train.finetune import finetune
from modelpress.compress.train.results import result_dict
from modelpress.errors import OptionError
from modelpress.ir.feeds import as_model
from modelpress.ir.graph import copy_model
from modelpress.ir.io import model_bytes
from modelpress.passes.optimize import optimize
from modelpress.verify.metrics import Comparison, compare

Progress = Callable[[str, int, int, float | None], None]
DEFAULT_TRAINING = TrainConfig(epochs=2, lr=1e-3)
INDEX_BITS = 8
# A centroid's step moves every weight that shares it, and after folding no BatchNorm absorbs the
# shift: at the pruning's learning rate (3e-3) the codebook retraining lost accuracy on
# mobilenet-digits at 80% (96.4% -> 94.7%); at a tenth it held or gained.
CODEBOOK_LR = 0.1


@dataclass
class DeepResult:
    model: ir.Model  # the decoded model: what `run` executes from the .mpz
    data: bytes  # the .mpz file
    sparsity: float
    bits: int
    stages: list[dict]  # {"stage", "bytes", "ratio"}
    parts: dict  # compressed bytes of each part of the file
    seconds: float
    training: list[TrainResult] = field(default_factory=list)
    check: Comparison | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        return self.stages[-1]["ratio"]

    def to_dict(self) -> dict:
        # the file's size and ratio, not its bytes
        return {
            **result_dict(self, skip=("model", "data")),
            "size": len(self.data),
            "ratio": self.ratio,
        }


def deep_compress(
    model,
    *,
    data,
    labels_key: str | None = None,
    image=None,
    limit: int | None = None,
    sparsity: float = 0.9,
    bits: int = 5,
    scope: str = "global",
    keep: list[str] | tuple[str, ...] = (),
    train: TrainConfig | bool | None = None,
    alpha: float | None = None,
    temperature: float = 1.0,
    soft: str = "auto",
    optimize_graph: bool = True,
    float16: bool = True,
    progress: Progress | None = None,
) -> DeepResult:
    """Compress ``model`` (see the module docstring); ``train=False`` skips both retrainings,
    ``optimize_graph=False`` keeps the graph as it is, ``float16=False`` keeps codebooks and side
    tensors in float32."""
    started = time.perf_counter()
    original = as_model(model)
    if not 0 <= sparsity < 1:
        raise OptionError(f"sparsity {sparsity}: choose a fraction in [0, 1)")
    if not 1 <= bits <= 8:
        raise OptionError(f"bits {bits}: choose 1 to 8 bits per weight")
    dataset = TrainData.load(data, original, labels_key=labels_key, image=image, limit=limit)
    config = (
        None if train is False else (train if isinstance(train, TrainConfig) else DEFAULT_TRAINING)
    )
    split = config.val_fraction if config else 0.1
    train_part, held = dataset.split(split, seed=config.seed if config else 0)
    result_training: list[TrainResult] = []

    def stage_progress(name: str):
        return None if progress is None else (lambda s, t, loss: progress(name, s, t, loss))

    # 1. pruning, retrained with the zeros held
    current = copy_model(original)
    masks, _ = unstr.masks(current, sparsity=sparsity, scope=scope, keep=frozenset(keep))
    if not masks:
        raise OptionError("the model has no Conv, Gemm or MatMul weights to compress")
    unstr.apply_masks(current, masks)

    def tune(model: ir.Model, stage: str, prepare, train_config) -> ir.Model:
        """Retrain ``model`` on the training part, the original as teacher."""
        tuned, tr = finetune(
            model,
            train_part,
            teacher=original,
            config=train_config,
            loss=TeacherLoss(soft=soft, alpha=alpha, temperature=temperature),
            held_out=held,
            prepare=prepare,
            progress=stage_progress(stage),
        )
        result_training.append(tr)
        return tuned

    if config:
        masked = lambda m: unstr.mask_module(m, masks)  # noqa: E731  (the zeros held)
        current = tune(current, "retraining the pruned model", masked, config)
    if optimize_graph:
        current = optimize(current, level=2).model
        # folding scales a weight's output channels (under new names): its zeros stay where they were
        masks = {
            w.name: current.graph.initializers[w.name].const_value.numpy() != 0
            for w in unstr.prunable_weights(current, keep=frozenset(keep))
        }
    optimized_bytes = len(model_bytes(current))
    # 2. weight sharing, codebooks retrained (through their float16 rounding, and the side tensors')
    layers = {}
    for name, mask in masks.items():
        array = current.graph.initializers[name].const_value.numpy()
        codebook, codes = kmeans.share(array, mask, bits)
        if float16:
            codebook = half.rounded(codebook)
        layers[name] = (codebook, codes, mask)
        current.graph.initializers[name].const_value = ir.tensor(
            np.where(mask, codebook[codes], np.float32(0)).astype(array.dtype), name=name
        )
    side = _side_tensors(current, layers) if float16 else []
    _round_half(current, side)

    def prepare_shared(module) -> None:
        kmeans.shared_module(module, layers, float16=float16)
        half.half_module(module, side)

    if config:
        codebook_config = replace(config, lr=config.lr * CODEBOOK_LR)
        current = tune(current, "retraining the codebooks", prepare_shared, codebook_config)
        _round_half(current, side)  # the values the forward pass used; exact in float16
    tensors = []
    for name, (codebook, codes, mask) in layers.items():
        trained = current.graph.initializers[name].const_value.numpy()
        tensors.append(
            mpz.SharedTensor(
                name,
                _codebook_of(trained, codes, mask, codebook),
                codes,
                mask,
                bits,
                trained.dtype.name,
            )
        )
    # 3. entropy coding
    data_bytes, parts = mpz.encode(current, tensors)
    decoded = mpz.decode(data_bytes)
    for name, value in current.graph.initializers.items():
        got = decoded.graph.initializers[name].const_value.numpy()
        assert got.dtype == value.const_value.dtype.numpy() and np.array_equal(
            got, value.const_value.numpy()
        ), name
    stages = _stages(len(model_bytes(original)), optimized_bytes, tensors, len(data_bytes))
    kept = sum(int(t.mask.sum()) for t in tensors)
    total = sum(t.mask.size for t in tensors)
    return DeepResult(
        model=decoded,
        data=data_bytes,
        sparsity=1 - kept / total,
        bits=bits,
        stages=stages,
        parts=parts,
        seconds=time.perf_counter() - started,
        training=result_training,
        check=compare(original, decoded, held if held is not None else dataset),
    )


def _codebook_of(
    trained: np.ndarray, codes: np.ndarray, mask: np.ndarray, start: np.ndarray
) -> np.ndarray:
    """The codebook the trained weights use: every weight of code k holds the same value."""
    book = start.astype(np.float32).copy()
    kept_codes, kept_values = codes[mask], trained[mask]
    if kept_codes.size:
        first = np.unique(kept_codes, return_index=True)
        book[first[0]] = kept_values[first[1]]
    return book


def _side_tensors(model: ir.Model, shared: dict) -> list[str]:
    """The float tensors besides the shared weights that are stored (so first rounded) as float16."""
    return [
        name
        for name, value in model.graph.initializers.items()
        if name not in shared
        and value.const_value is not None
        and half.roundable(value.const_value.numpy())
    ]


def _round_half(model: ir.Model, names: list[str]) -> None:
    for name in names:
        value = model.graph.initializers[name]
        value.const_value = ir.tensor(half.rounded(value.const_value.numpy()), name=name)


def _stages(base: int, optimized: int, tensors: list, file_bytes: int) -> list[dict]:
    shared_dense = sum(t.mask.size * 4 for t in tensors)
    rest = optimized - shared_dense  # the graph and every tensor the stages leave as they are
    nnz = sum(int(t.mask.sum()) for t in tensors)
    bits = tensors[0].bits if tensors else 0
    pruned = rest + nnz * (32 + INDEX_BITS) // 8
    shared = rest + nnz * (bits + INDEX_BITS) // 8 + sum(t.codebook.size * 4 for t in tensors)
    rows = [
        ("float32", base),
        ("graph optimized", optimized),
        ("pruned", pruned),
        ("pruned + shared weights", shared),
        ("+ entropy coding (.mpz)", file_bytes),
    ]
    return [{"stage": s, "bytes": int(b), "ratio": round(base / b, 2)} for s, b in rows]
