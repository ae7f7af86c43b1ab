"""modelpress keygen -o key.bin: a new 256-bit key for protected models."""

from __future__ import annotations

from modelpress.cli._common import console


def add_parser(sub) -> None:
    p = sub.add_parser(
        "keygen",
        help="write a new 256-bit key for `modelpress protect`",
        description="Write a new random 256-bit key (32 raw bytes) readable by its owner only. "
        "Keep it apart from the packages it opens: whoever has both has the model.",
        epilog="example: modelpress keygen -o key.bin && modelpress protect model.onnx -o model.mpk --key-file key.bin",
    )
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to write the key (must not exist)")
    p.add_argument("--force", action="store_true", help="replace an existing file (packages made with the old key stay locked)")
    p.set_defaults(func=run)


def run(args) -> int:
    from modelpress.protect import keygen
    from modelpress.protect.keys import key_id

    path = keygen(args.output, overwrite=args.force)
    console.print(f"wrote {path}: a 256-bit key, owner-only permissions (key id {key_id(path.read_bytes()).hex()})")
    return 0
