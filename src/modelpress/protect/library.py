"""The operator library of an obfuscated model: what its anonymous nodes compute, sealed with the
key and shipped inside the model (a ``uint8`` initializer, ``LIBRARY_INIT``).

What it holds depends on the mode chosen when the model was protected:

- **runtime**: one function per anonymous node (its original nodes, the ``Decode`` placeholders of
  its weights, its share of the expansion chain), the private domain, and what the interface
  needs back (renamed input/output names, the model's metadata). ``attach`` decrypts it into the
  model in memory: the placeholders become the inverse transforms (``weights.decode_nodes``) and
  the functions become the model's local functions, which the runtime executes node by node.
  The original graph is never rebuilt; the original names are nowhere, not even here.
- **storage**: the original model's structure (a *skeleton*: every node, name and small constant,
  each perturbed weight a placeholder naming the visible tensor it is stored in and carrying its
  transform). ``restore`` rebuilds the original model from it in memory; the visible graph is only
  what a reader of the file sees.

Sealing is the package format itself (``package.KIND_LIBRARY``), so the same rules hold: authenticated,
a wrong key or any change refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir

from modelpress.errors import ModelLoadError
from modelpress.ir import from_bytes, model_bytes
from modelpress.protect import mixing, package, weights
from modelpress.protect.optypes import DECODE_DOMAIN, DECODE_OP

LIBRARY_INIT = "mpk_library"
META_KEY = "modelpress.protect"
_LIB_META = "mpk.library"
PLACEHOLDER = (
    "mpk:S:"  # location prefix of a skeleton's placeholder; the rest names the stored tensor
)
TRANSFORM_META = "mpk.transform"
MODES = ("runtime", "storage")


@dataclass
class Library:
    mode: str
    domain: str = ""
    functions: list[ir.Function] = field(default_factory=list)
    io_names: dict[str, str] = field(default_factory=dict)  # visible -> original (runtime)
    metadata: dict[str, str] = field(default_factory=dict)  # the model's own (runtime)
    ir_version: int = 8
    skeleton: ir.Model | None = None  # storage
    secrets: dict[str, dict] = field(default_factory=dict)  # runtime: input -> its value's spec

    def to_model(self) -> ir.Model:
        info = {
            "mode": self.mode,
            "domain": self.domain,
            "io_names": self.io_names,
            "metadata": self.metadata,
            "secrets": self.secrets,
        }
        if self.mode == "storage":
            assert self.skeleton is not None
            model = self.skeleton
            model.metadata_props[_LIB_META] = json.dumps(info)
            return model
        opsets = {"": 1}
        for f in self.functions:
            opsets.update(f.opset_imports)
        graph = ir.Graph([], [], nodes=[], opset_imports=opsets, name="library")
        return ir.Model(
            graph,
            ir_version=self.ir_version,
            functions=self.functions,
            metadata_props={_LIB_META: json.dumps(info)},
        )

    @classmethod
    def from_model(cls, model: ir.Model, name: str) -> Library:
        try:
            info = json.loads(model.metadata_props.pop(_LIB_META))
        except (KeyError, ValueError):
            raise ModelLoadError(
                f"{name}: the operator library is not one this modelpress can read"
            ) from None
        if info.get("mode") == "storage":
            return cls("storage", skeleton=model)
        return cls(
            "runtime",
            domain=info["domain"],
            functions=list(model.functions.values()),
            io_names=info.get("io_names", {}),
            metadata=info.get("metadata", {}),
            ir_version=model.ir_version,
            secrets=info.get("secrets", {}),
        )


def seal(library: Library, key: bytes) -> bytes:
    return package.encrypt_bytes(model_bytes(library.to_model()), key, kind=package.KIND_LIBRARY)


def unseal(blob: bytes, key: bytes, *, name: str) -> Library:
    plain = package.decrypt_bytes(
        blob, key, expect_kind=package.KIND_LIBRARY, name=f"{name} (operator library)"
    )
    return Library.from_model(from_bytes(plain, source=name), name)


def embed(model: ir.Model, blob: bytes) -> None:
    """Ship the sealed library inside ``model`` and mark it as obfuscated."""
    value = ir.Value(
        name=LIBRARY_INIT,
        const_value=ir.tensor(np.frombuffer(blob, dtype=np.uint8), name=LIBRARY_INIT),
    )
    model.graph.register_initializer(value)
    model.metadata_props[META_KEY] = json.dumps({"format": 1, "library": LIBRARY_INIT})


def is_obfuscated(model: ir.Model) -> bool:
    return META_KEY in model.metadata_props


def take(model: ir.Model, key: bytes, *, name: str) -> Library:
    """Remove the sealed library from ``model`` and open it."""
    if not is_obfuscated(model) or LIBRARY_INIT not in model.graph.initializers:
        raise ModelLoadError(f"{name}: not an obfuscated model (no operator library in it)")
    value = model.graph.initializers.pop(LIBRARY_INIT)
    del model.metadata_props[META_KEY]
    return unseal(value.const_value.numpy().tobytes(), key, name=name)


def attach(model: ir.Model, library: Library) -> ir.Model:
    """Runtime mode: ``model`` (its library taken) with the functions it calls, ready to run."""
    opset = model.opset_imports.get("", 1)
    for f in library.functions:
        for node in list(f):
            if node.domain != DECODE_DOMAIN or node.op_type != DECODE_OP:
                continue
            transform = weights.Transform.from_json(node.attributes["transform"].value)
            nodes, out = weights.decode_nodes(transform, node.inputs[0], opset)
            f.graph.insert_before(node, nodes)
            node.outputs[0].replace_all_uses_with(out)
            f.graph.remove(node, safe=True)
        f.opset_imports.pop(DECODE_DOMAIN, None)
        model.functions[f.identifier()] = f
        for (
            domain,
            version,
        ) in f.opset_imports.items():  # domains the bodies use (com.microsoft, ...)
            model.opset_imports.setdefault(domain, version)
    model.opset_imports[library.domain] = 1
    model.ir_version = max(model.ir_version, library.ir_version, 8)
    for value in [*model.graph.inputs, *model.graph.outputs]:
        if value.name in library.io_names:
            value.name = library.io_names[value.name]
    for value in model.graph.inputs:
        spec = library.secrets.get(value.name)
        if spec is not None:
            supply(model.graph, value, secret_value(spec))
    model.metadata_props.update(library.metadata)
    return model


def secret_value(spec: dict) -> np.ndarray:
    """The value the runtime supplies to a secret input, made from its spec."""
    if "transform" in spec:
        t = weights.Transform.from_json(spec["transform"])
        return weights.noise(t).reshape(t.shape)
    return mixing.values(spec)


def supply(graph: ir.Graph, value: ir.Value, array: np.ndarray) -> None:
    """Give the graph input ``value`` its run-time value, in memory: an initializer of the same
    name, which keeps it an input (ONNX Runtime folds no initializer that is also an input, and
    every caller of the model sees it as given)."""
    value.const_value = ir.tensor(array)
    value.shape = ir.Shape(array.shape)
    graph.register_initializer(value)


def restore(model: ir.Model, library: Library, *, name: str) -> ir.Model:
    """Storage mode: the original model, rebuilt from the skeleton and the stored weights."""
    skeleton = library.skeleton
    assert skeleton is not None
    stored = model.graph.initializers

    def placeholder(tensor: ir.TensorProtocol) -> str | None:
        if isinstance(tensor, ir.ExternalTensor) and str(tensor.location).startswith(PLACEHOLDER):
            return str(tensor.location)[len(PLACEHOLDER) :]
        return None

    # how many placeholders read each stored tensor: it is let go after its last one, so that
    # the stored tensors (float64: twice the weights) shrink as the weights are rebuilt
    uses: dict[str, int] = {}
    for graph in skeleton.graphs():
        tensors = [v.const_value for v in graph.initializers.values()]
        tensors += [n.attributes["value"].value for n in graph if _is_constant(n)]
        for t in tensors:
            if (where := placeholder(t)) is not None:
                uses[where] = uses.get(where, 0) + 1

    def fill(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
        where = placeholder(tensor)
        if where is None:
            return tensor
        source = stored.get(where)
        if source is None or source.const_value is None:
            raise ModelLoadError(
                f"{name}: a stored weight the library refers to is missing (a damaged model)"
            )
        transform = weights.Transform.from_json(tensor.metadata_props[TRANSFORM_META])
        weight = ir.Tensor(
            weights.decode(source.const_value.numpy(), transform),
            dtype=transform.dtype,
            name=tensor.name,
        )
        uses[where] -= 1
        if not uses[where]:
            source.const_value = None
        return weight

    for graph in skeleton.graphs():
        for value in graph.initializers.values():
            value.const_value = fill(value.const_value)
        for node in graph:
            if _is_constant(node):
                node.attributes["value"] = ir.AttrTensor(
                    "value", fill(node.attributes["value"].value)
                )
    return skeleton


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and "value" in node.attributes
