"""provider.mjs (panva's oidc-provider from npm, installed from this folder's lock) run by Node on a free port."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.npm import npm_installed

HERE = Path(__file__).resolve().parent
CLIENT_ID = "appliance"
CLIENT_SECRET = "client-secret-for-tests"


@dataclass(frozen=True)
class Provider:
    issuer: str
    people_file: Path

    def set_people(self, people: dict[str, dict[str, Any]]) -> None:
        """Each person's claims by login name (their `sub`), read by the provider at every sign-in."""
        self.people_file.write_text(json.dumps(people))


@contextmanager
def running_provider(work: Path, redirect_uri: str, issuer_host: str = "127.0.0.1") -> Iterator[Provider]:
    """The provider, its one client redirecting to `redirect_uri`; `issuer_host` names it (it listens on
    127.0.0.1): localhost makes it another site than an appliance at 127.0.0.1, as a real provider is."""
    root = npm_installed(HERE, "npm-oidc-provider")
    shutil.copy(HERE / "provider.mjs", work / "provider.mjs")
    (work / "node_modules").symlink_to(root / "node_modules")  # ESM resolves packages beside the script
    people, log = work / "people.json", work / "provider.log"
    people.write_text("{}")
    env = {**os.environ, "CLAIMS_FILE": str(people), "REDIRECT_URI": redirect_uri, "ISSUER_HOST": issuer_host}
    env |= {"CLIENT_ID": CLIENT_ID, "CLIENT_SECRET": CLIENT_SECRET}
    with log.open("w") as stderr:
        process = subprocess.Popen(
            ["node", "provider.mjs"], cwd=work, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
    try:
        assert process.stdout is not None
        port = process.stdout.readline().strip()
        if not port.isdigit():
            pytest.fail(f"the OpenID Provider did not start: {log.read_text()}")
        yield Provider(f"http://{issuer_host}:{port}", people)
    finally:
        process.terminate()
        process.wait(timeout=10)
