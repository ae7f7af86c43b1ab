"""A workload for planning: the kernels of one forward pass, as per-sample costs.

Every cost a planner needs is linear in the batch for the models it handles (CNNs, encoders,
decoder layers at a fixed sequence length): FLOPs and activations grow with the batch, weights
are read once per pass. A ``Kernel`` therefore stores FLOPs and activation elements *per sample*
and weight elements once; ``at_batch`` evaluates it. Element counts (not bytes) are stored so the
advisor can price them at any precision.

``workload_from_onnx`` builds one from an ONNX graph by profiling it at batch 1 and 2: the
difference is the per-sample part, the rest is fixed (weights). A graph with a fixed batch is
profiled once and divided by its batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx_ir as ir

from modelpress.errors import OptionError
from modelpress.ir import from_proto, to_proto
from modelpress.ir.shapes import dim_name
from modelpress.profile.cost import WHOLE_REDUCTIONS, WINDOW_POOLS, profile_model
from modelpress.runtime.ort import session
from modelpress.verify.inputs import generate_inputs

# What runs a kernel, and so which peak and which efficiency apply. Tensor kinds run on matrix
# units; the others on vector units and are nearly always limited by memory bandwidth. "free"
# ops are views (Reshape, Shape, ...) that move no data.
TENSOR_KINDS = ("matmul", "conv", "attention")
KINDS = TENSOR_KINDS + ("elementwise", "norm", "reduce", "memory", "free")

_OP_KIND = {
    **dict.fromkeys(
        ("MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "MatMulNBits", "FusedMatMul"), "matmul"
    ),
    **dict.fromkeys(("Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "FusedConv"), "conv"),
    **dict.fromkeys(("Attention", "MultiHeadAttention", "GroupQueryAttention"), "attention"),
    **dict.fromkeys(
        (
            "BatchNormalization",
            "InstanceNormalization",
            "LayerNormalization",
            "GroupNormalization",
            "SkipLayerNormalization",
            "SimplifiedLayerNormalization",
            "RMSNormalization",
        ),
        "norm",
    ),
    **dict.fromkeys(
        (*WINDOW_POOLS, *WHOLE_REDUCTIONS, "Softmax", "LogSoftmax", "ArgMax", "TopK"),
        "reduce",
    ),
    **dict.fromkeys(
        (
            "Transpose",
            "Concat",
            "Slice",
            "Gather",
            "GatherElements",
            "Split",
            "Pad",
            "Cast",
            "Expand",
            "Tile",
            "Resize",
            "Where",
            "ScatterND",
            "DepthToSpace",
            "SpaceToDepth",
        ),
        "memory",
    ),
    **dict.fromkeys(
        (
            "Reshape",
            "Flatten",
            "Squeeze",
            "Unsqueeze",
            "Shape",
            "Identity",
            "Constant",
            "Size",
            "ConstantOfShape",
            "Range",
            "Dropout",
        ),
        "free",
    ),
}
# Elementwise ops and BatchNorm that an inference compiler folds into the producing kernel's
# epilogue (TensorRT, ORT and XLA all do): in inference they cost neither a launch nor a trip
# through memory. Eager training runs each as its own kernel.
FUSABLE_OPS = frozenset(
    (
        "Relu",
        "Clip",
        "Add",
        "Mul",
        "Sub",
        "Div",
        "Sigmoid",
        "Tanh",
        "Gelu",
        "FastGelu",
        "Erf",
        "HardSwish",
        "HardSigmoid",
        "LeakyRelu",
        "PRelu",
        "Elu",
        "Selu",
        "Swish",
        "Mish",
        "Softplus",
        "Neg",
        "Sqrt",
        "Pow",
        "BatchNormalization",
        "QuantizeLinear",
        "DequantizeLinear",
        "BiasGelu",
    )
)


@dataclass(frozen=True)
class Kernel:
    """One kernel of a forward pass. FLOPs and activation elements per sample; weights fixed."""

    name: str
    kind: str
    flops: float  # per sample; a multiply-add counts 2
    weight_elems: float  # read once per pass, whatever the batch
    in_elems: float  # activations read, per sample
    out_elems: float  # activations written, per sample (what training saves for backward)
    fusable: bool = False
    # Matrix-like kernels: the width N of the output matrix (features of a GEMM's M×N output,
    # output channels of a convolution's implicit GEMM), which does not grow with the batch; the
    # advisor counts output tiles from it (wave quantisation). 0 = unknown: no tile model.
    out_cols: float = 0.0

    def at_batch(self, batch: int) -> tuple[float, float, float]:
        """(FLOPs, weight elements, activation elements) for a pass over ``batch`` samples."""
        return self.flops * batch, self.weight_elems, (self.in_elems + self.out_elems) * batch


@dataclass(frozen=True)
class Workload:
    """What one sample costs: the forward kernels, parameters and, for LLMs, the decode step."""

    name: str
    kernels: tuple[Kernel, ...]
    params: float
    sample: str  # what one sample is, in words ("image 3x224x224", "sequence of 384 tokens")
    tokens_per_sample: int = 1  # training throughput in tokens/s is samples/s times this
    unit: str = "samples/s"  # how throughput is counted: "samples/s" or "tokens/s"
    # Generation (decoder LLMs): kernels of one decode step per sequence, at the mean context of
    # the generated tokens, how many tokens a request generates, and the KV-cache elements a
    # sequence holds at its full context.
    decode: tuple[Kernel, ...] = ()
    gen_tokens: int = 0
    cache_elems: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def flops_per_sample(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def saved_elems_per_sample(self) -> float:
        """Activations kept for the backward pass: the output of every kernel but views and
        elementwise activations (frameworks run those in place or keep only one of input and
        output); no recomputation."""
        return sum(k.out_elems for k in self.kernels if k.kind not in ("free", "elementwise"))

    @property
    def is_generative(self) -> bool:
        return bool(self.decode)


def kind_of(op_type: str) -> str:
    return _OP_KIND.get(op_type, "elementwise")


def input_shapes(
    model: ir.Model,
    batch: int,
    seq: int | None,
    *,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, tuple[int, ...]], int | None]:
    """Concrete input shapes at ``batch``: dim 0 is the batch; another symbolic dim takes its
    size from ``dims`` (by name), else ``seq``; an input named in ``shapes`` takes that shape
    but for dim 0 when it is the (symbolic) batch.

    Returns the shapes and the model's own fixed batch (None when the batch is symbolic).
    """
    dims = dims or {}
    shapes = shapes or {}
    out: dict[str, tuple[int, ...]] = {}
    fixed_batch = None
    initializers = set(model.graph.initializers)
    for value in model.graph.inputs:
        if value.name in initializers:
            continue
        if value.shape is None:
            raise OptionError(f"model input {value.name!r} has no shape: export it with shapes")
        given = shapes.get(value.name)
        if given is not None and len(given) != len(value.shape):
            raise OptionError(
                f"`shapes` {value.name}: {len(given)} dimensions, the model input has {len(value.shape)}"
            )
        sizes = []
        for i, d in enumerate(value.shape):
            if isinstance(d, int):
                sizes.append(d)
                if i == 0:
                    fixed_batch = d
            elif i == 0:
                sizes.append(batch)
            elif given is not None:
                sizes.append(int(given[i]))
            elif dim_name(d) is not None and dim_name(d) in dims:
                sizes.append(dims[dim_name(d)])
            elif seq is not None:
                sizes.append(seq)
            elif dim_name(d) is not None:
                raise OptionError(
                    f"model input {value.name!r} has a symbolic dimension {d} besides the batch: "
                    f"give `dims` {d}=SIZE (or `seq`)"
                )
            else:  # an unnamed dimension: --dim cannot name it, --shape gives the whole input
                example = "x".join(
                    str(x) if isinstance(x, int) else ("1" if j == 0 else "SIZE")
                    for j, x in enumerate(value.shape)
                )
                raise OptionError(
                    f"model input {value.name!r} has an unnamed dynamic dimension (axis {i}) "
                    f"besides the batch: give its shape in `shapes` ({value.name}={example}) "
                    "or its size in `seq`"
                )
        out[value.name] = tuple(sizes)
    return out, fixed_batch


def _with_run_shapes(model: ir.Model, shapes: dict[str, tuple[int, ...]]) -> ir.Model:
    """A copy of ``model`` whose intermediate values carry the shapes of a real run.

    ONNX shape inference cannot follow every exporter's shape arithmetic; when it gives up, one
    run under ONNX Runtime (optimizations off, every intermediate exposed as an output) on
    generated inputs gives the true shapes.
    """

    runner = from_proto(to_proto(model))
    graph = runner.graph
    outputs = {v.name for v in graph.outputs}
    by_name = {v.name: v for node in graph for v in node.outputs if v.name}
    graph.outputs.extend(v for name, v in by_name.items() if name not in outputs)
    names = list(by_name)
    feeds = generate_inputs(runner, shapes=shapes)
    try:
        outs = session(runner, optimize="disabled").run(names, feeds)
    except Exception as exc:  # noqa: BLE001 - ONNX Runtime refuses these shapes: the user's to give
        shown = ", ".join(f"{k}={'x'.join(map(str, v)) or 'scalar'}" for k, v in shapes.items())
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        why = why.split("Status Message: ")[-1][:160]
        raise OptionError(
            f"the model does not run at the input shapes {shown} ({why}): give every input's "
            "shape in `shapes` (NAME=AxB; dimensions the graph ties must agree)"
        ) from None
    results = dict(zip(names, outs, strict=True))
    copy = from_proto(to_proto(model))
    for node in copy.graph:
        for value in node.outputs:
            if value.name in results:
                value.shape = ir.Shape(list(results[value.name].shape))
                value.dtype = ir.DataType.from_numpy(results[value.name].dtype)
    return copy


def _profile(model: ir.Model, shapes: dict[str, tuple[int, ...]]):

    cost = profile_model(model, shapes)
    if cost.unknown_shapes:
        cost = profile_model(_with_run_shapes(model, shapes), shapes)
    return cost


def workload_from_onnx(
    model: ir.Model,
    *,
    name: str,
    seq: int | None = None,
    dims: dict[str, int] | None = None,
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> Workload:
    """A workload from an ONNX graph (see the module docstring for the batch-1/batch-2 rule);
    symbolic dimensions besides the batch from ``dims``/``shapes``/``seq`` (``input_shapes``).

    Shapes come from ONNX shape inference, or from a run under ONNX Runtime where inference
    leaves some unknown.
    """
    shapes1, fixed = input_shapes(model, 1, seq, dims=dims, shapes=shapes)
    cost1 = _profile(model, shapes1)
    if fixed is None:
        cost2 = _profile(model, input_shapes(model, 2, seq, dims=dims, shapes=shapes)[0])
        pairs = list(zip(cost1.nodes, cost2.nodes, strict=True))
        divisor = 1.0
    else:
        pairs = [(n, None) for n in cost1.nodes]
        divisor = float(fixed)
    kernels = []
    for n1, n2 in pairs:
        if n2 is not None:
            # per sample = cost(2) - cost(1); for a batch-linear graph whatever is left at
            # batch 1 is fixed (weights, shape arithmetic)
            flops = n2.flops - n1.flops
            acts = n2.activation_elems - n1.activation_elems
        else:
            flops = n1.flops / divisor
            acts = n1.activation_elems / divisor
        # output of the first result at batch 1 (or the fixed batch, divided): what is saved
        out_elems = (
            min(_prod(n1.output_shape) / divisor, acts) if n1.output_shape is not None else 0.0
        )
        kernels.append(
            Kernel(
                name=n1.name or n1.op_type,
                kind=kind_of(n1.op_type),
                flops=flops,
                weight_elems=n1.weight_elems,
                in_elems=acts - out_elems,
                out_elems=out_elems,
                fusable=n1.op_type in FUSABLE_OPS,
                out_cols=_out_cols(kind_of(n1.op_type), n1.output_shape),
            )
        )
    params = sum(k.weight_elems for k in kernels)
    first = next(iter(shapes1.values()), ())
    return Workload(
        name=name,
        kernels=tuple(kernels),
        params=params,
        sample="input " + "x".join(str(d) for d in first[1:]) if first else "sample",
        notes=(f"{cost1.unknown_shapes} nodes with unknown shapes were not counted",)
        if cost1.unknown_shapes
        else (),
    )


def _out_cols(kind: str, shape) -> float:
    """N of a matrix product's output (last axis) or a convolution's output channels (axis 1)."""
    if not shape or kind not in ("matmul", "conv"):
        return 0.0
    axis = 1 if kind == "conv" else -1
    if len(shape) < 2 or not isinstance(shape[axis], int):
        return 0.0
    return float(shape[axis])


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


__all__ = [
    "FUSABLE_OPS",
    "KINDS",
    "TENSOR_KINDS",
    "Kernel",
    "Workload",
    "kind_of",
    "workload_from_onnx",
]
