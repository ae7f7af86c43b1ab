"""A real ``modelpress serve`` in its own process, for the calibration and the plan's check.

The server runs in a child Python (``python -m modelpress.deploy.process SPEC``): the load
generator must not share the server's interpreter lock, and the measurement is of the server
users run (``serve.server.serve``: uvicorn, the app, the batcher), not of a copy. ``Served`` starts
it on a free port of 127.0.0.1, waits until it answers ``/v2/health/ready`` and stops it with
SIGTERM (it drains and exits 0).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from modelpress.errors import InputError

_READY_S = 120.0


@dataclass(frozen=True)
class ServerSpec:
    model: str  # an .onnx file, or an .mpk with key_file
    name: str
    max_batch: int
    max_delay_ms: float
    max_queue: int
    key_file: str | None = None
    key_env: str | None = None  # (the child inherits this process's environment)
    device: str = "cpu"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``with Served(spec) as port:``: a server answering on ``127.0.0.1:port``."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> int:
        src = str(Path(__file__).resolve().parents[2])  # the folder holding `modelpress`
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        cmd = [
            sys.executable,
            "-m",
            "modelpress.deploy.process",
            json.dumps(asdict(self.spec)),
            str(self.port),
        ]
        # the server's messages go to a file: a pipe nobody reads would fill and stop it
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                err = self.log.read().decode(errors="replace").strip().splitlines()
                self.__exit__(None, None, None)
                raise InputError(
                    f"the server for {self.spec.model} exited: {err[-1] if err else self.proc.returncode}"
                )
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v2/health/ready", timeout=2)
                return self.port
            except OSError:
                time.sleep(0.2)
        self.__exit__(None, None, None)
        raise InputError(f"the server for {self.spec.model} did not start in {_READY_S:g} s")

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _main(spec_json: str, port: int) -> None:
    from modelpress.ir import load
    from modelpress.protect import load_key, open_package
    from modelpress.serve.options import ServeOptions
    from modelpress.serve.repository import Repository
    from modelpress.serve.server import serve

    spec = ServerSpec(**json.loads(spec_json))
    if spec.key_file or spec.key_env:
        model = open_package(spec.model, load_key(spec.key_file, spec.key_env))
    else:
        model = load(spec.model)
    repo = Repository.open([(spec.name, model)], device=spec.device)
    options = ServeOptions(
        max_batch=spec.max_batch, max_delay_ms=spec.max_delay_ms, max_queue=spec.max_queue
    )
    serve(repo, options, host="127.0.0.1", port=port)


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
