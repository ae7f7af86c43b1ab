"""modelpress compress MODEL -o model.mpz: Deep Compression (prune, share weights, entropy code).

Deep Compression (Han et al.): prune the smallest weights and retrain, cluster each layer's weights
into 2^bits shared values and retrain the codebooks, entropy code the result into an .mpz file.
`run`, `bench` and `verify` read .mpz files (decoded in memory).
"""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes
from modelpress.cli._training import training_run, write_checked
from modelpress.errors import OptionError
from modelpress.ir.files import write_bytes


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "compress",
        __doc__,
        help="Deep Compression to an .mpz file: pruning, shared weights, entropy coding, with retraining",
        examples=[
            "modelpress compress cnn.onnx -o tiny.mpz --sparsity 0.9 --bits 5 --data train.npz --labels-key y"
        ],
    )
    options.add_model(p)
    options.add_key(p)
    options.add_output(p, help="the .mpz file to write")
    options.add_training_data(p, required=True)
    options.add_with_default(
        p, "--sparsity", type=float, default=0.9, metavar="X", help="fraction of weights pruned"
    )
    options.add_with_default(
        p,
        "--bits",
        type=int,
        default=5,
        metavar="N",
        help="bits per shared weight: 2^N values per layer",
    )
    options.add_scope(p, help="one pruning threshold for all layers (global) or per layer")
    options.add_list(p, "--exclude", metavar="NODE", help="layers left dense")
    options.add_training(p)
    options.add_record(p)
    p.set_defaults(func=run)


@options.speaks_flags
def run(args) -> int:
    from modelpress.compress.deep import deep_compress

    if not str(args.output).endswith(".mpz"):
        raise OptionError(f"{args.output}: the output of compress is an .mpz file (name it *.mpz)")
    with training_run("compress", args) as (recorder, model, progress):
        result = deep_compress(
            model,
            **options.keywords(args, "sparsity", "bits", "scope"),
            keep=options.listed(args.exclude),
            progress=progress,
            **options.training_args(args),
        )
    t = Table(title="compression by stage", show_edge=False)
    t.add_column("stage")
    t.add_column("size", justify="right")
    t.add_column("ratio", justify="right")
    for s in result.stages:
        t.add_row(s["stage"], human_bytes(s["bytes"]), f"{s['ratio']:.1f}x")
    console.print(t)
    console.print(
        f"{human_bytes(len(result.data))}, {result.ratio:.1f}x smaller, sparsity {result.sparsity:.1%}, {result.bits} bits"
    )
    return write_checked(
        args,
        result,
        result.training,
        result.to_dict(),
        recorder,
        lambda: write_bytes(args.output, result.data),
    )
