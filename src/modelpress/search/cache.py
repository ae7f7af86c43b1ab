"""The trial cache: a search that is stopped continues where it stopped.

Each finished trial is written at once (atomically) to ``<folder>/trials/<key>.json``. The key is a
hash of everything the trial's outcome depends on: the original model's bytes, the data file's
bytes, the metric, the target and timing batch, the candidate's steps and modelpress's version.
A restarted search with the same inputs finds its trials there and does not run them again; a
changed model, data set or metric gives new keys, so a stale trial is never reused. The model of
the best candidate so far is kept too (``<folder>/best.onnx``, with its key in ``best.json``), so
that the end of a resumed search need not rebuild it. An unreadable entry is treated as absent.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import onnx_ir as ir

from modelpress.ir import load, save
from modelpress.ir.files import write_json
from modelpress.search.space import Candidate
from modelpress.search.trial import Trial

CACHE_FORMAT = 1


def file_digest(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def bytes_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class TrialCache:
    """Trials by key, on disk under ``folder`` (or in memory only when ``folder`` is None)."""

    def __init__(self, folder: str | os.PathLike | None, context: dict):
        self.folder = Path(folder) if folder is not None else None
        self.context = dict(context, format=CACHE_FORMAT)
        self._memory: dict[str, Trial] = {}
        if self.folder is not None:
            (self.folder / "trials").mkdir(parents=True, exist_ok=True)

            write_json(self.folder / "search.json", self.context)

    def key(self, candidate: Candidate) -> str:
        text = json.dumps({"context": self.context, "steps": candidate.spec()}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def get(self, key: str) -> Trial | None:
        if key in self._memory:
            return self._memory[key]
        if self.folder is None:
            return None
        path = self.folder / "trials" / f"{key}.json"
        try:
            trial = Trial.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None
        self._memory[key] = trial
        return trial

    def put(self, trial: Trial) -> None:
        self._memory[trial.key] = trial
        if self.folder is not None:
            data = trial.to_dict()
            data.pop("cached", None)
            write_json(self.folder / "trials" / f"{trial.key}.json", data)

    def keep_model(self, key: str, model: ir.Model) -> None:
        if self.folder is None:
            return

        # the model first: best.json never names a model that is not there
        save(model, self.folder / "best.onnx")
        write_json(self.folder / "best.json", {"key": key})

    def kept_model(self, key: str) -> ir.Model | None:
        if self.folder is None:
            return None
        try:
            if json.loads((self.folder / "best.json").read_text()).get("key") != key:
                return None

            return load(self.folder / "best.onnx")
        except Exception:  # noqa: BLE001 - a damaged kept model is rebuilt from its steps
            return None


__all__ = ["CACHE_FORMAT", "TrialCache", "bytes_digest", "file_digest"]
