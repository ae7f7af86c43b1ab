"""modelpress keygen -o key.bin: a new 256-bit key for protected models.

Write a new random 256-bit key (32 raw bytes) readable by its owner only. Keep it apart from the
packages it opens: whoever has both has the model.
"""

from __future__ import annotations

from modelpress.cli import options
from modelpress.cli._common import console
from modelpress.protect import keygen
from modelpress.protect.keys import key_id


def add_parser(sub) -> None:
    p = options.add_command(
        sub,
        "keygen",
        __doc__,
        help="write a new 256-bit key for `modelpress protect`",
        examples=[
            "modelpress keygen -o key.bin && modelpress protect model.onnx -o model.mpk --key-file key.bin"
        ],
    )
    options.add_output(p, help="where to write the key (refused if a file is there)")
    options.add_switch(
        p, "--force", "replace an existing file (packages made with the old key stay locked)"
    )
    options.add_record(p)
    p.set_defaults(func=run)


def run(args) -> int:

    record = options.Recorder("keygen", args)
    path = keygen(args.output, overwrite=args.force)
    kid = key_id(path.read_bytes()).hex()
    console.print(f"wrote {path}: a 256-bit key, owner-only permissions (key id {kid})")
    record.write({"output": str(path), "bits": 256, "key_id": kid})  # the id, never the key
    return 0
