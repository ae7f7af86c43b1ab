"""JSON records: what a command did, written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from modelpress.errors import ModelSaveError


def write_json_atomic(path: Path, data: dict) -> Path:
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{path}: output directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".modelpress-", suffix=".json", dir=parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, default=_default)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _default(obj):
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def write_npz_atomic(path, arrays: dict) -> Path:
    """Write arrays to an .npz file atomically."""
    import numpy as np

    path = Path(path)
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ModelSaveError(f"{path}: output directory {parent} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=".modelpress-", suffix=".npz", dir=parent)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
