"""The figures of the robustness and security suites in one table: `python -m tests.figures`.

Each suite writes artifacts/figures/<suite>.json shaped {"suite": str, "figures": {name: int | float}}. A name
ending in "(must be 0)" is a promise: the command exits 1 when such a figure is not 0. `record()` is the writer
the suites share: it keeps each test's figures under "cases" so that re-running one test replaces its own figures
instead of adding to them, and "figures" is their sum over the cases.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

FIGURES_DIR = Path(__file__).resolve().parent.parent / "artifacts" / "figures"
MUST_BE_ZERO = "(must be 0)"

Number = int | float


def record(suite: str, case: str, figures: Mapping[str, Number], directory: Path = FIGURES_DIR) -> None:
    """Set `case`'s figures in the suite's file (other cases are kept) and recompute the suite's totals."""
    path = directory / f"{suite}.json"
    directory.mkdir(parents=True, exist_ok=True)
    # pytest-xdist's workers write the same suite's file: the read, update and write happen under a lock.
    with (directory / f".{suite}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cases: dict[str, dict[str, Number]] = {}
        if path.exists():
            cases = json.loads(path.read_text()).get("cases", {})
        cases[case] = {**cases.get(case, {}), **figures}
        totals: dict[str, Number] = {}
        for values in cases.values():
            for name, value in values.items():
                totals[name] = totals.get(name, 0) + value
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(json.dumps({"suite": suite, "figures": totals, "cases": cases}, indent=2, sort_keys=True))
        partial.replace(path)  # a reader never sees half a file


def load(directory: Path = FIGURES_DIR) -> list[tuple[str, dict[str, Number]]]:
    """(suite, figures) of every figures file present, by suite name; files of another shape are skipped."""
    found = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        figures = data.get("figures") if isinstance(data, dict) else None
        if isinstance(figures, dict):
            numbers = {str(k): v for k, v in figures.items() if isinstance(v, int | float) and not isinstance(v, bool)}
            found.append((str(data.get("suite") or path.stem), numbers))
    return sorted(found)


def _shown(value: Number) -> str:
    return f"{value:,}" if isinstance(value, int) or value.is_integer() else f"{value:,.2f}"


def table(suites: list[tuple[str, dict[str, Number]]]) -> tuple[str, bool]:
    """The table as text, and whether every "(must be 0)" figure is 0."""
    rows = [(suite, name, _shown(value)) for suite, figures in suites for name, value in sorted(figures.items())]
    broken = [(s, n) for s, figures in suites for n, v in figures.items() if n.endswith(MUST_BE_ZERO) and v != 0]
    header = ("suite", "figure", "value")
    suite_w, name_w, value_w = (max(len(r[i]) for r in [header, *rows]) for i in range(3))

    def line(suite: str, name: str, value: str) -> str:
        return f"{suite:<{suite_w}}  {name:<{name_w}}  {value:>{value_w}}"

    out = [line(*header), line("-" * suite_w, "-" * name_w, "-" * value_w)]
    previous = None
    for suite, name, value in rows:
        out.append(line(suite if suite != previous else "", name, value))
        previous = suite
    out.extend(f"NOT 0: {suite} / {name}" for suite, name in broken)
    return "\n".join(out), not broken


def main() -> int:
    suites = load()
    if not suites:
        print(f"no figures in {FIGURES_DIR}: run the suites first (pytest tests/robustness tests/security)")
        return 1
    text, ok = table(suites)
    print(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
