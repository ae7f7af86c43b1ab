"""``serve.yaml``: the settings ``modelpress serve DEPLOY_DIR`` reads, and reading a deploy folder.

A deploy folder holds one model (``model.onnx``, or ``model.mpk`` when protected) and
``serve.yaml``::

    model: model.onnx        # the file beside this one
    name: cnn_digits         # served as /v2/models/cnn_digits
    device: cpu              # where the plan runs it (cpu, cuda)
    max_batch: 4             # rows per model run (the plan's cap)
    max_delay_ms: 0          # how long an idle model waits for company
    max_queue: 64            # requests that may wait; one more gets 503
    workers: 1               # server processes per replica (one model thread each)
    replicas: 2              # replicas the plan needs at its rate (Ray Serve, KServe)
    protected: false         # model.mpk needs its key (--key-file / --key-env)
    plan: {...}              # the promise: rate, target, predicted p99 (for people)

``read_folder`` checks every field and names the one that is wrong.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from modelpress.errors import InputError, require
from modelpress.ir.files import write_bytes
from modelpress.serve.options import ServeOptions

SERVE_FILE = "serve.yaml"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class ServeSettings:
    model: str
    name: str
    max_batch: int
    max_delay_ms: float
    max_queue: int
    replicas: int = 1
    workers: int = 1
    device: str = "cpu"
    protected: bool = False
    plan: dict = field(default_factory=dict)

    def options(self, **overrides) -> ServeOptions:
        """The server's options (``overrides``: an API key, a drain timeout)."""
        return ServeOptions(
            max_batch=self.max_batch,
            max_delay_ms=self.max_delay_ms,
            max_queue=self.max_queue,
            **overrides,
        )

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self, folder: str | Path) -> Path:
        yaml = require("yaml", extra="search", purpose="writing serve.yaml")
        head = (
            "# written by `modelpress deploy`; `modelpress serve THIS_FOLDER` reads it.\n"
            "# max_batch/max_delay_ms/max_queue: the batcher; replicas: how many the plan needs\n"
        )
        text = head + yaml.safe_dump(self.to_dict(), sort_keys=False)
        return write_bytes(Path(folder) / SERVE_FILE, text.encode())


_FIELDS = {
    "model": str,
    "name": str,
    "max_batch": int,
    "max_delay_ms": (int, float),
    "max_queue": int,
    "replicas": int,
    "workers": int,
    "device": str,
    "protected": bool,
    "plan": dict,
}
_REQUIRED = ("model", "name", "max_batch", "max_delay_ms", "max_queue")


def is_folder(path: str | Path) -> bool:
    """Whether ``path`` is a deploy folder (a folder with ``serve.yaml``)."""
    p = Path(path)
    return p.is_dir() and (p / SERVE_FILE).is_file()


def read_folder(path: str | Path) -> tuple[ServeSettings, Path]:
    """The settings of the deploy folder ``path`` and the path of its model; one ``InputError``
    line naming the file and field that is wrong."""
    folder = Path(path)
    where = folder / SERVE_FILE
    if not where.is_file():
        raise InputError(
            f"{folder}: not a deploy folder (no {SERVE_FILE}; write one with modelpress deploy)"
        )
    yaml = require("yaml", extra="search", purpose="reading serve.yaml")
    try:
        data = yaml.safe_load(where.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of settings")
    for key in _REQUIRED:
        if key not in data:
            raise InputError(f"{where}: field {key!r} is missing")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise InputError(f"{where}: unknown field {unknown[0]!r} (fields: {', '.join(_FIELDS)})")
    for key, kind in _FIELDS.items():
        if key in data and (
            not isinstance(data[key], kind) or (kind is int and isinstance(data[key], bool))
        ):
            raise InputError(f"{where}: field {key!r} has the wrong type ({data[key]!r})")
    for key in ("max_batch", "max_queue", "replicas", "workers"):
        if key in data and data[key] < 1:
            raise InputError(f"{where}: field {key!r} must be at least 1")
    if data["max_delay_ms"] < 0:
        raise InputError(f"{where}: field 'max_delay_ms' must not be negative")
    if not _NAME.match(data["name"]):
        raise InputError(
            f"{where}: field 'name' {data['name']!r}: use letters, digits, '_', '-', '.'"
        )
    model = folder / data["model"]
    if Path(data["model"]).name != data["model"] or not model.is_file():
        raise InputError(f"{where}: field 'model': no file {data['model']!r} in {folder}")
    return ServeSettings(**data), model


__all__ = ["SERVE_FILE", "ServeSettings", "is_folder", "read_folder"]
