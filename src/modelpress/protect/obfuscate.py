"""Obfuscation: the steps, in the order they run, on a copy of the model.

1. ``compress_graph``: the nodes are partitioned into convex groups (a layer and its followers);
2. ``optypes`` + ``weights``: each group moves into a function of its own with a random op type
   in a private domain; the weights it reads are stored perturbed (keyed noise and mapping) in the
   visible graph, smaller constants move into the function;
3. ``expand``: decoys, extra edges from unrelated tensors and a cancelling chain of opaque
   predicates are added (``type_decoys``: in runtime mode, decoys of the model's op types);
4. ``names``: every name becomes a random token, and doc strings, metadata and the shapes of
   intermediate values are cleared;
5. ``library``: the functions (runtime mode) or the original structure (storage mode) are sealed
   with the key and embedded in the model;
6. ``signature``: the whole model (graph, stored weights, sealed library) is signed with a MAC
   under the key, so an obfuscated model written without encryption cannot be edited either.

Secrets never come from ``seed``: the seed draws the structure (groups, names, sites), so a
protection can be repeated, while the weights' noise keys are fresh random bytes each time.
"""

from __future__ import annotations

import gc
import secrets
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir.shapes import ensure_types
from modelpress.ir.stats import iter_nodes
from modelpress.passes.constant_folding import FoldConstants
from modelpress.protect import library as lib
from modelpress.protect import mixing, signature, weights
from modelpress.protect.compress_graph import find_groups
from modelpress.protect.correlation import Targets, standardized
from modelpress.protect.expand import expand
from modelpress.protect.names import Namer, all_names, rename
from modelpress.protect.optypes import DECODE_DOMAIN, Visible, const_tensor, extract
from modelpress.protect.type_decoys import type_decoys

MIN_OPSET = 7
MIN_HIDDEN = 16  # runtime mode: smaller constants (shapes, axes, scalars) stay in the library


@dataclass
class Obfuscated:
    model: ir.Model  # what the file shows: the obfuscated graph, its library sealed inside
    seed: int
    groups: int
    decoys: int
    visible_weights: int
    library_constants: int
    mixed: int = 0


def _used_domains(functions: list[ir.Function]) -> set[str]:
    """The domains of the nodes in ``functions`` (their subgraphs included)."""
    return {node.domain for f in functions for node in iter_nodes(f.graph)}


def _rename_functions(
    work: ir.Model, namer: Namer, domain: str, callers: list[ir.Function]
) -> list[ir.Function]:
    """The model's own local functions, renamed into the private domain; their call sites follow,
    in the main graph, in the functions themselves and in the ``callers`` (the groups' bodies)."""
    renames: dict[tuple, tuple[str, str]] = {}
    for f in work.functions.values():
        renames[f.identifier()] = (domain, namer())
    functions = list(work.functions.values())
    work.functions.clear()

    for graph in [work.graph, *(f.graph for f in [*functions, *callers])]:
        for node in iter_nodes(graph):
            new = renames.get((node.domain, node.op_type, node.overload))
            if new:
                node.domain, node.op_type = new
                node.overload = ""
    for f in functions:
        f.domain, f.name = renames[f.identifier()]
        f.overload = ""
    return functions


def obfuscate(
    model: ir.Model, *, key: bytes, ratio: float, seed: int | None, mode: str, rename_io: bool
) -> Obfuscated:
    if not 0.0 <= ratio <= 1.0:
        raise OptionError(
            f"--ratio {ratio}: must be between 0 and 1 (0.1, 0.3 and 0.6 are small, medium, large)"
        )
    if mode not in lib.MODES:
        raise OptionError(f"--mode {mode!r}: one of {', '.join(lib.MODES)}")
    opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0))
    if opset < MIN_OPSET:
        raise OptionError(
            f"obfuscation needs default-domain opset {MIN_OPSET} or newer (the model has {opset}); "
            f"upgrade it first with `modelpress optimize --opset {MIN_OPSET}`"
        )
    seed = secrets.randbits(62) if seed is None else seed
    rng = np.random.default_rng(seed)
    namer = Namer(rng, all_names(model))
    work = model.clone()
    skeleton = model.clone() if mode == "storage" else None
    ensure_types(work)
    secret_specs: dict[str, dict] = {}  # runtime mode: graph input -> how its value is made

    def secret_input(spec: dict, dtype: ir.DataType, rank: int) -> ir.Value:
        # a shape of the right rank, each dimension a random symbol: no size shows
        shape = ir.Shape([namer() for _ in range(rank)])
        value = ir.Value(name=namer(), type=ir.TensorType(dtype), shape=shape)
        work.graph.inputs.append(value)
        secret_specs[value.name] = spec
        return value

    mixed_names: set[str] = set()

    def mixed_name() -> str:
        mixed_names.add(name := namer())
        return name

    mixed = 0
    before = set(work.graph)
    if mode == "runtime":
        FoldConstants()(work)  # shapes computed from constants (pads, ...) become constants
        mixed = mixing.mix(work.graph, rng=rng, secret=secret_input, new_name=mixed_name)
        gc.collect()  # the weights mixing replaced (graphs hold reference cycles)
    unmixing = set(work.graph) - before
    domain = "x" + namer()
    opsets = {d: v for d, v in work.opset_imports.items()}

    by_size: dict[int, list[np.ndarray]] = {}
    for a in weights.constant_arrays(model, kinds="fiu", min_size=weights.MIN_ELEMENTS):
        by_size.setdefault(a.size, []).append(a)
    targets: dict[int, Targets] = {}  # the originals of each size, to stay clear of
    stored: dict[ir.Value, Visible] = {}
    inlined: set[ir.Value] = set()
    skeleton_slots: dict[
        str, tuple[ir.Value, str]
    ] = {}  # original value name -> (stored, transform)

    def policy(value: ir.Value) -> Visible | None:
        if value in stored:
            return stored[value]
        try:
            array = const_tensor(value).numpy()
        except Exception:  # noqa: BLE001 - strings and exotic types go into the library whole
            array = None
        if value.name in mixed_names and array is not None:
            # mixed (mixing.py): it stays as it is, in the file when large, else in the library
            # (in the file, chance alone would let a few hundred values correlate visibly)
            if array.size < mixing.MIN_ELEMENTS:
                inlined.add(value)
                return None
            stored[value] = Visible(value)
            return stored[value]
        runtime = mode == "runtime"
        smallest = MIN_HIDDEN if runtime else weights.MIN_ELEMENTS
        if array is None or not weights.supported(array, smallest):
            inlined.add(value)
            return None
        if array.size not in targets:
            targets[array.size] = Targets(by_size.get(array.size) or [array])
        s, transform = weights.encode(
            array, rng=rng, targets=targets[array.size], permute=not runtime
        )
        if runtime:
            # S - R, R a graph input with no value in the file: nothing can fold it. A small S
            # stays in the library: in the file, chance alone would correlate it with something
            noise = secret_input(
                {"transform": transform.to_json()}, ir.DataType.from_numpy(s.dtype), array.ndim
            )
            if array.size < weights.MIN_ELEMENTS:
                sealed = ir.tensor(s.reshape(array.shape))
                stored[value] = Visible(None, secret=noise, dtype=transform.dtype, sealed=sealed)
                return stored[value]
            name = namer()
            holder = ir.Value(name=name, const_value=ir.tensor(s.reshape(array.shape), name=name))
            work.graph.register_initializer(holder)
            stored[value] = Visible(holder, secret=noise, dtype=transform.dtype)
            return stored[value]
        closest = float(np.abs(targets[array.size] @ standardized([s])[0]).max())
        if closest > 2 * weights.TARGET_CORRELATION:
            inlined.add(value)  # too many same-size originals to stay clear of: keep it sealed
            return None
        del s
        name = namer()
        # S is recomputed each time it is read (signed, measured, written): never all held
        lazy = weights.lazy_stored(const_tensor(value), transform, name)
        holder = ir.Value(name=name, const_value=lazy)
        work.graph.register_initializer(holder)
        visible = Visible(holder, transform.to_json())
        stored[value] = visible
        skeleton_slots[value.name] = (holder, visible.transform_json)
        return visible

    groups = find_groups(work.graph, rng, uncounted=unmixing)
    anonymous = [
        extract(work.graph, g, domain=domain, op_type=namer(), opset_imports=opsets, policy=policy)
        for g in groups
    ]
    work.graph.sort()
    for node in [
        n
        for n in work.graph
        if n.op_type == "Constant" and not any(o.uses() or o.is_graph_output() for o in n.outputs)
    ]:
        work.graph.remove(node, safe=True)
    for name in [
        n for n, v in work.graph.initializers.items() if not v.uses() and not v.is_graph_output()
    ]:
        del work.graph.initializers[name]
    added = expand(
        work.graph,
        anonymous,
        ratio=ratio,
        rng=rng,
        domain=domain,
        new_type=namer,
        opset=opset,
        opsets=opsets,
    )
    decoys = len(added)
    if mode == "runtime":
        types = Counter(n.op_type for g in model.graphs() for n in g if n.domain in ("", "ai.onnx"))
        added += type_decoys(
            work.graph,
            types,
            rng=rng,
            domain=domain,
            new_type=namer,
            opset=opset,
            opsets=opsets,
            into=added[0] if added else None,
        )
    bodies = [a.function for a in anonymous + added]
    functions = bodies + _rename_functions(work, namer, domain, bodies)
    originals = {d for d in model.opset_imports if d not in ("", "ai.onnx")} - _used_domains(bodies)
    for f in functions:
        used = _used_domains([f])
        for d in [d for d in f.opset_imports if d in originals and d not in used]:
            del f.opset_imports[d]  # a renamed function's old domain
        if domain in used:  # it calls one of the model's own functions, now in the private domain
            f.opset_imports[domain] = 1
        if DECODE_DOMAIN in used:
            f.opset_imports[DECODE_DOMAIN] = 1
        work.functions[f.identifier()] = f
    metadata = dict(model.metadata_props)
    io_names = rename(work, namer, rename_io=rename_io)
    work.functions.clear()

    if mode == "runtime":
        library = lib.Library(
            "runtime",
            domain,
            functions,
            io_names,
            metadata,
            ir_version=max(model.ir_version, 8),
            secrets=secret_specs,
        )
    else:
        _place_holders(skeleton, skeleton_slots)
        library = lib.Library("storage", skeleton=skeleton)
    work.opset_imports.clear()
    work.opset_imports.update({"": opset, domain: 1})
    work.ir_version = max(model.ir_version, 8)
    lib.embed(work, lib.seal(library, key))
    return Obfuscated(
        signature.sign(work, key),
        seed,
        len(anonymous),
        decoys,
        len({v.stored for v in stored.values() if v.stored is not None}),
        len(inlined),
        mixed,
    )


def _place_holders(skeleton: ir.Model, slots: dict[str, tuple[ir.Value, str]]) -> None:
    """In the original's copy, each weight that is stored perturbed becomes a reference to the
    stored tensor (and its transform)."""

    def hole(tensor: ir.TensorProtocol, stored: ir.Value, transform: str) -> ir.ExternalTensor:
        return ir.ExternalTensor(
            lib.PLACEHOLDER + stored.name,
            0,
            tensor.nbytes,
            tensor.dtype,
            shape=tensor.shape,
            name=tensor.name,
            metadata_props={lib.TRANSFORM_META: transform},
        )

    graph = skeleton.graph
    for name, value in graph.initializers.items():
        if name in slots and not value.is_graph_input():
            value.const_value = hole(value.const_value, *slots[name])
    for node in graph:
        if (
            node.op_type == "Constant"
            and node.outputs[0].name in slots
            and "value" in node.attributes
        ):
            node.attributes["value"] = ir.AttrTensor(
                "value", hole(node.attributes["value"].value, *slots[node.outputs[0].name])
            )
