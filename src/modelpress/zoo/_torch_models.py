"""PyTorch sources of the zoo models and their export to ONNX (TorchScript exporter, ``dynamo=False``).

Trained and loaded modules are cached per process and handed out as deep copies, so a caller that
fine-tunes or quantizes its copy never changes what the next caller (or the next export) gets.
"""

from __future__ import annotations

import copy
import io
import warnings
from functools import cache, lru_cache

import onnx
import torch

from modelpress.zoo import bert as _bert
from modelpress.zoo import minilm as _minilm_src
from modelpress.zoo.cnn import MobileNetDigits, ResNetDigits
from modelpress.zoo.digits import digits_data, train_classifier

# name -> (module class, epochs, learning rate, seed). Four epochs reach ~98% test accuracy in a
# few seconds on one core; more only buys time.
_CNNS = {
    "resnet-digits": (ResNetDigits, 4, 1e-2, 0),
    "mobilenet-digits": (MobileNetDigits, 4, 1e-2, 0),
}


@cache
def _trained(name: str) -> torch.nn.Module:
    cls, epochs, lr, seed = _CNNS[name]
    torch.manual_seed(seed)  # the initial weights
    return train_classifier(cls(), epochs=epochs, lr=lr, seed=seed)


def trained_cnn(name: str) -> tuple[torch.nn.Module, tuple]:
    example = torch.from_numpy(digits_data().x_test[:2])
    return copy.deepcopy(_trained(name)), (example,)


def bert_tiny() -> tuple[torch.nn.Module, tuple]:
    feeds = _bert.sample_inputs(2, 16)
    args = tuple(
        torch.from_numpy(feeds[k]) for k in ("input_ids", "attention_mask", "token_type_ids")
    )
    return _bert.build_module(), args


@lru_cache(maxsize=1)
def _loaded_minilm() -> torch.nn.Module:
    return _minilm_src.build_module()


def minilm() -> tuple[torch.nn.Module, tuple]:
    return copy.deepcopy(_loaded_minilm()), _minilm_src.example_args()


def _export(module, args, **kwargs) -> onnx.ModelProto:
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter warns about its own deprecation and about traced shape
        # arithmetic that the dynamic axes below make dynamic anyway.
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), args, buf, dynamo=False, **kwargs)
    return onnx.load_from_string(buf.getvalue())


def export_cnn(module, args) -> onnx.ModelProto:
    # PRESERVE on an eval-mode module exports inference BatchNormalization nodes but skips the
    # exporter's eval-mode peephole pass, which would fold each BatchNorm into its Conv.
    return _export(
        module,
        args,
        input_names=["image"],
        output_names=["logits"],
        dynamic_axes={"image": {0: "batch"}, "logits": {0: "batch"}},
        opset_version=17,
        training=torch.onnx.TrainingMode.PRESERVE,
    )


_TEXT_INPUTS = ["input_ids", "attention_mask", "token_type_ids"]
_TEXT_AXES = {k: {0: "batch", 1: "sequence"} for k in _TEXT_INPUTS}


def export_bert(module, args) -> onnx.ModelProto:
    return _export(
        module,
        args,
        input_names=_TEXT_INPUTS,
        output_names=["last_hidden_state", "pooler_output"],
        dynamic_axes={
            **_TEXT_AXES,
            "last_hidden_state": {0: "batch", 1: "sequence"},
            "pooler_output": {0: "batch"},
        },
        opset_version=12,
    )


def export_minilm(module, args) -> onnx.ModelProto:
    return _export(
        module,
        args,
        input_names=_TEXT_INPUTS,
        output_names=["sentence_embedding"],
        dynamic_axes={**_TEXT_AXES, "sentence_embedding": {0: "batch"}},
        opset_version=17,
    )
