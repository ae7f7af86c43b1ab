"""One record schema for every command: what it was asked, what it did and measured.

Every command's ``--json FILE`` writes a ``Record``; ``modelpress report`` reads records back and
turns them into a page. The envelope is fixed (``schema``, ``command``, ``version``, ``started``,
``seconds``, ``options``, ``machine``); ``result`` is the command's own result, as its library
function's ``to_dict()`` returns it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from modelpress.errors import InputError
from modelpress.ir.files import write_json

SCHEMA = "modelpress.record/1"


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
    schema: str = SCHEMA

    @classmethod
    def of(cls, command: str, args, result: dict, *, started: float) -> Record:
        return cls(
            command=command,
            result=result,
            options=_options(args),
            started=dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
            seconds=round(time.time() - started, 3),
            version=_version(),
            machine=machine(),
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, path: str | os.PathLike) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def read(cls, path: str | os.PathLike) -> Record:
        """A record from a file, or one ``InputError`` line saying what is wrong with it."""
        p = Path(path)
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(f"{p}: no such file") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{p}: not a JSON record ({str(exc).splitlines()[0][:120]})") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InputError(f"{p}: not a modelpress record (field 'schema' is not {SCHEMA!r})")
        for name in ("command", "result"):
            if name not in data:
                raise InputError(f"{p}: record has no field {name!r}")
        if not isinstance(data["result"], dict):
            raise InputError(f"{p}: field 'result' is not an object")
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})
