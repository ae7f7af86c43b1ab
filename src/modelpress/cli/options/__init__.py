"""Option groups that every command shares: one name for one idea.

| idea | option(s) |
| --- | --- |
| the model | positional ``MODEL`` (.onnx; .mpk with a key; .mpz) |
| where the result goes | ``-o/--output`` |
| the command's record | ``--json FILE`` |
| the command's page | ``--report FILE.html`` (model card and charts; ``modelpress report`` joins several) |
| samples to run the model on | ``--data PATH`` (+ ``--labels-key``, ``--batch-size``, ``--limit``) |
| shapes of dynamic inputs | ``--dim NAME=SIZE`` and ``--shape NAME=D1xD2...`` (repeatable) |
| where the model runs | ``--backend``, ``--device``, ``--place``, ``--strict``, ``--log-placement`` |
| the key of a protected model | ``--key-file`` / ``--key-env`` |

Options that take several values are repeatable (``--exclude a --exclude b``) or take one
comma-separated value (``--exclude a,b``), so none of them swallows a positional argument. Old
names stay as hidden aliases for one release (``--inputs`` and ``--calib`` for ``--data``).

The groups live one concept a module, and commands use them as ``options.<name>``:
``command`` (the parser, defaults in the help, lists, switches, old spellings, field names said as
flags), ``files`` (model, key, output, record, page), ``data`` (samples, shapes), ``running``
(backend, device, Ray, batching), ``training`` (training data, training, budget), ``search``
(what a search may spend). A name loads its module on first use: a command's parser loads only
the groups it uses (``serve`` does not load ``training``, whose choices come from the pruning
code).
"""

from __future__ import annotations

from modelpress.errors import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "command": [
            "FIELD_FLAGS", "OLD_SPELLINGS", "add_command", "add_list", "add_old_spellings",
            "add_switch", "add_with_default", "flags_of", "hidden_alias", "in_flags", "keywords",
            "listed", "require_positive", "speaks_flags",
        ],
        "data": [
            "add_data", "add_image_folder", "add_inputs", "add_shapes", "dims",
            "image_preprocess", "shapes",
        ],
        "files": [
            "Recorder", "add_key", "add_model", "add_output", "add_record", "add_report",
            "open_model",
        ],
        "running": ["add_batching", "add_device", "add_ray", "batching_rule", "placement"],
        "search": ["add_search_budget", "parse_duration", "search_args"],
        "training": [
            "add_budget", "add_scope", "add_training", "add_training_data", "budget",
            "training_args", "training_config",
        ],
    },
)  # fmt: skip
