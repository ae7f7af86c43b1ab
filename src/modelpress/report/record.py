"""One record schema for every command: what it was asked, what it did and measured.

Every command's ``--json FILE`` writes a ``Record``; ``modelpress report`` reads records back and
turns them into a page. The envelope is fixed (``schema``, ``command``, ``version``, ``started``,
``seconds``, ``options``, ``machine``); ``result`` is the command's own result, as its library
function's ``to_dict()`` returns it.

Format 2 adds what a page needs that a result does not hold, computed when the record is made
(the models may be gone when the page is built):
- ``models``: a card per model the command read or wrote, by role (``input``, ``output``, ...):
  inputs, outputs, op counts, parameters, FLOPs and bytes moved at batch 1 (``report.cards``);
- ``charts``: data for charts of things outside the result: ``roofline`` (a device's roofs and
  the model's kernels on it) and ``costs`` (the advisor's devices: throughput against cost).
A result with ``loss_curve`` (``{series: [values]}`` or ``[{"step": .., "loss": ..}, ...]``),
from the commands that train, gets a loss chart. Format 1 records are read as format 2 with
neither.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from modelpress.errors import InputError
from modelpress.ir.files import read_json, write_json

SCHEMA = "modelpress.record/2"
READABLE = ("modelpress.record/1", SCHEMA)


def _options(args: argparse.Namespace | dict) -> dict:
    items = vars(args).items() if isinstance(args, argparse.Namespace) else args.items()
    return {k: v for k, v in items if k not in ("func", "json") and not callable(v)}


def _version() -> str:
    try:
        return importlib.metadata.version("modelpress")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown"


def machine() -> dict:
    """The machine a record was made on: enough to tell two machines' numbers apart."""
    return {
        "system": platform.system(),
        "arch": platform.machine(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
    }


@dataclass
class Record:
    command: str
    result: dict
    options: dict = field(default_factory=dict)
    started: str = ""
    seconds: float = 0.0
    version: str = ""
    machine: dict = field(default_factory=dict)
    models: dict = field(default_factory=dict)  # role → model card
    charts: dict = field(default_factory=dict)  # "roofline", "costs": data for their charts
    schema: str = SCHEMA

    @classmethod
    def of(
        cls,
        command: str,
        args,
        result: dict,
        *,
        started: float,
        models: dict | None = None,
        charts: dict | None = None,
    ) -> Record:
        return cls(
            command=command,
            result=result,
            options=_options(args),
            started=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(
                timespec="seconds"
            ),
            seconds=round(time.time() - started, 3),
            version=_version(),
            machine=machine(),
            models=models or {},
            charts=charts or {},
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike) -> Record:
        """A record from a file, or one ``InputError`` line saying what is wrong with it."""
        p = Path(path)
        data = read_json(p, what="JSON record")
        if not isinstance(data, dict) or data.get("schema") not in READABLE:
            found = data.get("schema") if isinstance(data, dict) else None
            raise InputError(
                f"{p}: not a modelpress record (field 'schema' is {found!r}, expected {SCHEMA!r})"
            )
        for name in ("command", "result"):
            if name not in data:
                raise InputError(f"{p}: record has no field {name!r}")
        kinds = {
            "command": str,
            "result": dict,
            "options": dict,
            "machine": dict,
            "models": dict,
            "charts": dict,
        }
        for name, kind in kinds.items():
            if name in data and not isinstance(data[name], kind):
                raise InputError(
                    f"{p}: field {name!r} is not {'a string' if kind is str else 'an object'}"
                )
        for role, card in data.get("models", {}).items():
            if not isinstance(card, dict):
                raise InputError(f"{p}: field 'models.{role}' is not an object")
        known = {f for f in cls.__dataclass_fields__}
        record = cls(**{k: v for k, v in data.items() if k in known})
        record.schema = SCHEMA
        return record
