"""The agent CLIs users point at the appliance, installed from npm as a user would (pinned; `npm ci` checks every
package's hash against tests/clients/package-lock.json), and one appliance serving a long-context random model for
them: their instructions and tool lists run to 10-20k tokens, more than the bundled model's context."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.npm import npm_installed
from tests.web.server import Server, serving

HERE = Path(__file__).resolve().parent
# Codex's launcher (Node) runs its package's native executable; Claude Code's launcher needs its postinstall, which
# `--ignore-scripts` leaves out (nothing from the registry runs at install), so its native executable is run as is.
CODEX = "node_modules/.bin/codex"
CLAUDE = "node_modules/@anthropic-ai/claude-code-linux-x64/claude"
# Each answer stops here (the random model never says end-of-text): the clients then show what the stop means.
MAX_OUTPUT_TOKENS = 48


@dataclass(frozen=True)
class Agents:
    codex: Path
    claude: Path


@pytest.fixture(scope="session")
def agents() -> Agents:
    """codex and claude from the npm registry, installed once per lock file into the test cache (800 MB: kept
    between runs, outside the clone)."""
    root = npm_installed(HERE, "npm-clients")
    found = Agents(codex=root / CODEX, claude=root / CLAUDE)
    for path in (found.codex, found.claude):
        assert os.access(path, os.X_OK), f"{path} is not an executable: did the package's layout change?"
    return found


@pytest.fixture(scope="module")
def long_context_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """random:tiny-long (a 32k context), keeping the text of what it answers, so a test can compare what a client
    printed with what the server sent."""
    with serving(
        tmp_path_factory.mktemp("agents-server"), model="random:tiny-long", dtype="float32", store_text="true",
        default_max_tokens=str(MAX_OUTPUT_TOKENS),
    ) as srv:  # fmt: skip
        yield srv
