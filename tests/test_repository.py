"""The repository stands alone: no file refers to a path outside it (a link in a page, a path in
code or configuration), and the pages that say where things are point at files that exist."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = (".md", ".py", ".toml", ".yaml", ".yml", ".cfg", ".txt", ".json", ".sh")
LINK = re.compile(r"\]\(([^)#\s]+)")  # a markdown link's target
# paths that climb out of a folder into a sibling of the repository, or a machine's own folders
OUTSIDE = re.compile(r"\.\./shared/|/work/(?:main|wt|shared)/".replace("/", "[/]"))


def _tracked() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / line for line in out.stdout.splitlines()]
    return [f for f in files if f.suffix in TEXT or f.name in ("Makefile", "Dockerfile")]


def outside_references(files: list[Path], root: Path) -> list[str]:
    found = []
    for f in files:
        if not f.is_file():
            continue
        text = f.read_text(errors="replace")
        rel = f.relative_to(root)
        found += [f"{rel}: {m.group(0)}" for m in OUTSIDE.finditer(text)]
        if f.suffix == ".md":
            for target in LINK.findall(text):
                if "://" in target or target.startswith("mailto:"):
                    continue
                resolved = (f.parent / target).resolve()
                if not resolved.is_relative_to(root.resolve()):
                    found.append(f"{rel}: links {target} outside the repository")
                elif not resolved.exists():
                    found.append(f"{rel}: links {target}, which does not exist")
    return found


def test_no_file_refers_to_a_path_outside_the_repository():
    assert outside_references(_tracked(), ROOT) == []


def test_the_check_finds_planted_references(tmp_path):
    (tmp_path / "docs").mkdir()
    outside = "/".join(("..", "..", "shared", "DESIGN.md"))
    (tmp_path / "docs" / "a.md").write_text(f"[map]({outside}) [b](b.md) [ok](a.md)")
    (tmp_path / "x.py").write_text("PATH = '" + "/".join(("", "work", "main", "src")) + "'\n")
    found = outside_references([tmp_path / "docs" / "a.md", tmp_path / "x.py"], tmp_path)
    assert found == [
        f"docs/a.md: {outside[3:13]}",
        f"docs/a.md: links {outside} outside the repository",
        "docs/a.md: links b.md, which does not exist",
        "x.py: " + "/".join(("", "work", "main", "")),
    ]


def test_the_readme_and_the_architecture_page_cover_every_command():
    from modelpress.cli.main import COMMANDS

    readme = (ROOT / "README.md").read_text()
    for module in COMMANDS:
        name = module.removesuffix("_cmd")
        assert f"modelpress {name} " in readme, f"the README misses `{name}`"
    assert "docs/architecture.md" in readme
    assert "docs/architecture.md" in (ROOT / "DEVELOPERS.md").read_text()
    assert "qat" in (ROOT / "docs" / "quantize.md").read_text()
