"""The layers of DESIGN.md import one way, and protobuf stays behind ``ir``.

``violations`` reads every module's imports (function-local ones too) and reports each import of a
later layer, of a sibling layer, or of another layer's private (``_x``) module. The tests run it on
the package and on planted trees, so a broken check cannot pass silently.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "modelpress"

# Earlier layers first; a module may import its own layer and the ones before it. Packages that
# share a rank (convert, compress, protect) do not import each other.
ORDER: list[set[str]] = [
    {"errors"},
    {"ir"},
    {"zoo"},
    {"runtime"},
    {"verify"},
    {"passes"},
    {"convert", "compress", "protect"},
    {"serve"},
    {"profile"},
    {"advisor"},
    {"search"},
    {"deploy"},
    {"report"},
    {"demo"},
    {"cli"},
]
RANK = {name: i for i, names in enumerate(ORDER) for name in names}
# The models that demos, tests and benchmarks build are no library code's business.
ZOO_READERS = {"cli", "demo", "zoo"}


def _layer(parts: tuple[str, ...]) -> str | None:
    """The layer of ``modelpress.<parts>`` (None for the package's own ``__init__``)."""
    return parts[0].removesuffix(".py") if parts else None


def _imports(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """``(line, parts after 'modelpress')`` for every import of the package in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # (`from modelpress import ir` names a layer, `from x import _y` a private module)
            names = [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            if name == "modelpress" or name.startswith("modelpress."):
                found.append((node.lineno, tuple(name.split(".")[1:])))
    return found


def violations(package: Path) -> list[str]:
    out = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parts == ("__init__.py",):  # the public façade re-exports every layer
            continue
        here = _layer(rel.parts)
        for line, parts in _imports(path):
            there = _layer(parts)
            where = f"{rel}:{line}: imports modelpress.{'.'.join(parts)}"
            if there in (None, "__version__"):
                if here != "cli":
                    out.append(f"{where} (the package façade: import the layer itself)")
                continue
            if there not in RANK or here not in RANK:
                out.append(f"{where} (a layer missing from ORDER)")
                continue
            if there == "zoo" and here not in ZOO_READERS:
                out.append(f"{where} (only the CLI and the demo use the zoo)")
            elif RANK[there] > RANK[here]:
                out.append(f"{where} (a later layer)")
            elif RANK[there] == RANK[here] and there != here:
                out.append(f"{where} (a sibling layer)")
            elif there != here and any(p.startswith("_") and not p.startswith("__") for p in parts):
                out.append(f"{where} (another layer's private module)")
    return out


def test_the_package_imports_one_way():
    assert violations(PACKAGE) == []


def _planted(tmp_path: Path, rel: str, text: str) -> Path:
    package = tmp_path / "modelpress"
    shutil.copytree(PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    (package / rel).write_text(text)
    return package


@pytest.mark.parametrize(
    ("rel", "text", "reason"),
    [
        ("ir/planted.py", "from modelpress.runtime import ort\n", "a later layer"),
        (
            "runtime/planted.py",
            "def f():\n    from modelpress.verify import verify\n",
            "a later layer",
        ),
        ("compress/planted.py", "from modelpress.convert import api\n", "a sibling layer"),
        ("compress/planted.py", "from modelpress.passes import _private\n", "private module"),
        ("advisor/planted.py", "from modelpress.zoo import cnn\n", "use the zoo"),
        ("verify/planted.py", "import modelpress\n", "the package façade"),
    ],
)
def test_a_planted_violation_is_reported(tmp_path, rel, text, reason):
    found = violations(_planted(tmp_path, rel, text))
    assert len(found) == 1 and found[0].startswith(rel) and reason in found[0], found


def test_imports_within_a_layer_and_of_earlier_layers_are_allowed(tmp_path):
    text = (
        "from modelpress.compress.quantize import api\nfrom modelpress.ir.graph import copy_model\n"
    )
    assert violations(_planted(tmp_path, "compress/planted.py", text)) == []


def _ruff(path_in_repo: str, text: str) -> subprocess.CompletedProcess:
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (the dev extra)")
    return subprocess.run(
        [ruff, "check", "--select", "TID251", "--stdin-filename", path_in_repo, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.parametrize("text", ["import onnx\n", "def f():\n    from onnx import helper\n"])
def test_protobuf_outside_ir_is_refused_by_ruff(text):
    refused = _ruff("src/modelpress/runtime/planted.py", text)
    assert refused.returncode == 1 and "TID251" in refused.stdout
    allowed = _ruff("src/modelpress/ir/planted.py", text)
    assert allowed.returncode == 0, allowed.stdout
