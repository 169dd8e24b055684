"""`appliance layout`: the source tree's rooms and the engine's modules, each with its docstring's first paragraph,
as the README's Markdown tables (a test keeps the README equal to this output)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The Python packages; the README describes migrations/, systemd/ and tests/ by hand.
ROOMS = ("engine", "web", "appliance", "bench")
MODULE_TABLE_OF = "engine"


def summary(path: Path) -> str:
    """The first paragraph of a module's docstring on one line ('' where it has none), pipes escaped for Markdown."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n", 1)[0].split()).replace("|", "\\|")


def folders_table(root: Path = ROOT) -> str:
    rows = ["| folder | owns |", "| --- | --- |"]
    for room in ROOMS:
        for init in sorted((root / room).rglob("__init__.py")):
            folder = init.parent.relative_to(root).as_posix()
            rows.append(f"| `{folder}/` | {summary(init)} |")
    return "\n".join(rows) + "\n"


def modules_table(root: Path = ROOT, package: str = MODULE_TABLE_OF) -> str:
    rows = ["| module | owns |", "| --- | --- |"]
    for path in sorted((root / package).rglob("*.py")):
        if path.name == "__init__.py":
            continue
        rows.append(f"| `{path.relative_to(root).as_posix()}` | {summary(path)} |")
    return "\n".join(rows) + "\n"


def main() -> int:
    print(folders_table())
    print(modules_table(), end="")
    return 0
