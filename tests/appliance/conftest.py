"""Fixtures for the appliance's command line: a clean settings environment over a temporary data directory,
and `cli`, which runs `appliance ...` in this process and returns its exit status and output."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from appliance.cli.main import main


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: str
    err: str


Cli = Callable[..., Result]


class Terminal(io.StringIO):
    """stdin as a terminal, for the prompts (getpass itself is replaced in the tests that prompt)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Only this data directory among the APPLIANCE_* settings (the caller's own are removed)."""
    for name in list(os.environ):
        if name.startswith("APPLIANCE_"):
            monkeypatch.delenv(name)
    path = tmp_path / "data"
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(path))
    return path


@pytest.fixture
def cli(data_dir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    def run(*args: str, stdin: str = "", terminal: bool = False) -> Result:
        monkeypatch.setattr("sys.stdin", Terminal(stdin) if terminal else io.StringIO(stdin))
        capsys.readouterr()
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)  # as Python prints a SystemExit message
                code = 1
            else:
                code = exc.code or 0
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run
