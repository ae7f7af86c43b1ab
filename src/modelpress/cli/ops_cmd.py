"""modelpress ops --backend torch [--model M]: the ops a backend implements, or a model's missing ones."""

from __future__ import annotations

from rich.table import Table

from modelpress.cli._common import console, write_json

_LISTERS = {"torch": "modelpress.runtime.torch_backend"}


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ops",
        help="list the ops a backend supports (or check a model against them)",
        description="List the ONNX ops a backend implements, grouped by family; with --model, "
        "list the model's ops the backend does not implement.",
        epilog="example: modelpress ops --backend torch --model model.onnx",
    )
    p.add_argument("--backend", default="torch", choices=sorted(_LISTERS), help="backend (default torch)")
    p.add_argument("--model", help="an .onnx file: report which of its ops are not supported")
    p.add_argument("--json", metavar="FILE", help="also write the list as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    import importlib

    lister = importlib.import_module(_LISTERS[args.backend])
    families = lister.ops_by_family()
    supported = set(lister.supported_ops())
    data: dict = {"backend": args.backend, "ops": sorted(supported), "families": families}
    if args.model:
        from modelpress.ir import iter_nodes, load

        model = load(args.model)
        used = {n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}" for n in iter_nodes(model.graph)}
        missing = sorted(used - supported)
        data.update(model=args.model, model_ops=sorted(used), missing=missing)
        if missing:
            console.print(f"{args.model}: {len(missing)} of {len(used)} op types not supported by {args.backend}: {', '.join(missing)}")
        else:
            console.print(f"{args.model}: all {len(used)} op types are supported by {args.backend}")
    else:
        t = Table(title=f"ops supported by the {args.backend} backend ({len(supported)})", show_edge=False)
        t.add_column("family")
        t.add_column("ops")
        for family, names in families.items():
            t.add_row(family, ", ".join(names))
        console.print(t)
    if args.json:
        write_json(args.json, data)
    return 0
