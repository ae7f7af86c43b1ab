"""modelpress protect MODEL -o model.mpk --key-file key.bin [--obfuscate]: encrypt and obfuscate.

Encrypt a model with AES-256-GCM into a package (.mpk) that run, bench, verify, inspect and serve
open in memory with the key; --obfuscate also hides its architecture (anonymous operators,
perturbed weights, extra structure) and reports how much is hidden.
"""

from __future__ import annotations

from rich.table import Table

from modelpress.cli import options
from modelpress.cli._common import console, human_bytes, print_notes
from modelpress.cli.options import Recorder, add_key, add_record
from modelpress.errors import OptionError
from modelpress.ir.feeds import load_npz
from modelpress.protect import DEFAULT_RATIO, load_key, protect
from modelpress.protect.library import MODES
from modelpress.protect.package import DEFAULT_CHUNK, has_magic


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "protect",
        __doc__,
        help="encrypt a model (.mpk) and optionally obfuscate its graph, measuring what is hidden",
        examples=[
            "modelpress protect model.onnx -o model.mpk --key-file key.bin --obfuscate --strength 0.3"
        ],
    )
    p.add_argument("model", metavar="MODEL", help="the .onnx model to protect")
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the package (.mpk), or with --no-encrypt the obfuscated .onnx",
    )
    add_key(p)
    options.add_switch(p, "--obfuscate", "obfuscate the graph (see --obfuscation, --strength)")
    p.add_argument(
        "--strength",
        type=float,
        default=None,
        metavar="R",
        help=f"obfuscation strength in (0, 1]: the share of anonymous nodes that get decoys and opaque predicates (default {DEFAULT_RATIO:g}, small; 0.3 medium; 0.6 large: each site costs a few scalar kernels at run time)",
    )
    p.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="draws the obfuscated structure (groups, names, decoy sites) reproducibly; keys are always fresh",
    )
    p.add_argument(
        "--obfuscation",
        choices=MODES,
        help="what the obfuscation covers: runtime (with --obfuscate, the default): the obfuscated graph is what runs; storage: the original is restored in memory and runs at full speed",
    )
    p.add_argument(
        "--no-encrypt",
        dest="encrypt",
        action="store_false",
        help="write the obfuscated graph as .onnx (its operator library stays encrypted inside)",
    )
    options.add_switch(
        p,
        "--rename-io",
        "rename the graph's inputs and outputs too (restored when the model is opened)",
    )
    p.add_argument(
        "--chunk-size",
        type=int,
        default=None,
        metavar="BYTES",
        help="bytes per encrypted chunk (default 1 MiB)",
    )
    options.add_switch(
        p, "--no-verify", "skip opening the result and comparing it with the original"
    )
    options.add_inputs(p, to="to check the protected model on", shapes=False)
    add_record(p)
    p.set_defaults(func=run)


# the library's words for the options this command names differently
@options.speaks_flags(fields={"mode": "--obfuscation", "ratio": "--strength"})
def run(args) -> int:

    recorder = Recorder("protect", args)
    if has_magic(args.model):
        raise OptionError(f"{args.model}: already a protected package")
    if args.strength is not None and not args.obfuscate:
        raise OptionError("--strength sets the obfuscation: it needs --obfuscate")
    key = load_key(args.key_file, args.key_env)

    inputs = load_npz(args.data) if args.data else None
    with console.status("protecting…"):
        result = protect(
            args.model,
            key=key,
            output=args.output,
            obfuscate=args.obfuscate,
            ratio=DEFAULT_RATIO if args.strength is None else args.strength,
            seed=args.seed,
            mode=args.obfuscation,
            encrypt=args.encrypt,
            rename_io=args.rename_io,
            chunk_size=args.chunk_size or DEFAULT_CHUNK,
            verify=not args.no_verify,
            inputs=inputs,
        )
    what = "encrypted" if result.encrypted else "obfuscated"
    if result.encrypted and result.obfuscated:
        what = "obfuscated and encrypted"
    line = f"wrote {result.output}: {what}, {result.mode} mode, {human_bytes(result.bytes)} in {result.seconds:.1f} s (key id {result.key_id[:16]})"
    console.print(line)
    if result.verification:
        console.print(
            f"verified: outputs equal the original's (max relative error {result.verification['max_rel']:.2g})"
        )
    print_notes(result.notes)
    if result.metrics:
        console.print(_metrics_table(result))
    recorder.write(result.to_dict())
    return 0


def _metrics_table(result) -> Table:
    m = result.metrics
    t = Table(
        title=f"what the file shows (ratio {result.ratio}, seed {result.seed})", show_edge=False
    )
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("original", justify="right")
    t.add_row(
        "anonymous compute nodes",
        f"{m.anonymous_nodes}/{m.compute_nodes} ({100 * m.anonymous_share:.0f}%)",
        "",
    )
    t.add_row("op-type histogram distance (best matching)", f"{m.op_histogram_distance:.2f}", "0")
    t.add_row("nodes", f"{m.nodes} ({100 * m.node_change:+.0f}%)", str(m.original_nodes))
    t.add_row("edges", f"{m.edges} ({100 * m.edge_change:+.0f}%)", str(m.original_edges))
    t.add_row(
        "max |correlation| stored vs original weights",
        f"{m.max_weight_correlation:.3f} ({m.weight_pairs} pairs)",
        "1",
    )
    found = f"{len(m.names_found)} of {m.names_checked}"
    t.add_row("original names found in the file", found, "")
    return t
