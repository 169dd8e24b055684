"""provider.mjs (panva's oidc-provider from npm, installed from this folder's lock) run by Node on a free port."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import time
import warnings
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
STARTUP_S = 60


@dataclass(frozen=True)
class Provider:
    issuer: str
    people_file: Path

    def set_people(self, people: dict[str, dict[str, Any]]) -> None:
        """Each person's claims by login name (their `sub`), read by the provider at every sign-in."""
        self.people_file.write_text(json.dumps(people))


def stopped_silent(process: subprocess.Popen[str], work: Path) -> str:
    """What a provider that went quiet was doing (each thread's state and kernel wait, Node's own report with its
    JavaScript and native stacks, asked for with SIGUSR2, and what it wrote to stderr), once it is stopped."""
    lines = []
    for task in sorted(Path(f"/proc/{process.pid}").glob("task/*")):
        state = next((line for line in (task / "status").read_text().splitlines() if line.startswith("State")), "")
        lines.append(
            f"thread {task.name} ({(task / 'comm').read_text().strip()}): {state}, in {(task / 'wchan').read_text()}"
        )
    process.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 5
    while not (reports := sorted(work.glob("report.*.json"))) and time.monotonic() < deadline:
        time.sleep(0.1)
    if reports:
        time.sleep(0.5)  # written in one go, but give it the time
        report = json.loads(reports[0].read_text())
        reports[0].unlink()
        lines += ["JavaScript stack:", *report["javascriptStack"].get("stack", [report["javascriptStack"]["message"]])]
        lines += ["native stack:", *(frame.get("symbol", "?") for frame in report["nativeStack"][:20])]
    else:
        lines.append("no report from Node within 5 s of SIGUSR2")
    process.kill()
    process.communicate()  # and close its pipe
    return "\n".join([*lines, "stderr:", (work / "provider.log").read_text()])


def started(work: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """The provider's process and the first line it printed (its port), or "" once it has exited or stayed silent
    for STARTUP_S."""
    with (work / "provider.log").open("w") as stderr:
        process = subprocess.Popen(
            ["node", "--report-on-signal", f"--report-directory={work}", "provider.mjs"],
            cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], STARTUP_S)
    return process, process.stdout.readline().strip() if ready else ""


@contextmanager
def running_provider(work: Path, redirect_uri: str, issuer_host: str = "127.0.0.1") -> Iterator[Provider]:
    """The provider, its one client redirecting to `redirect_uri`; `issuer_host` names it (it listens on
    127.0.0.1): localhost makes it another site than an appliance at 127.0.0.1, as a real provider is.

    It prints its port in under a second. Once, in CI, it printed nothing for 900 s (no log was kept); a silent
    start is now reported (what the process was doing) and tried once more, and a second one fails the test."""
    root = npm_installed(HERE, "npm-oidc-provider")
    shutil.copy(HERE / "provider.mjs", work / "provider.mjs")
    (work / "node_modules").symlink_to(root / "node_modules")  # ESM resolves packages beside the script
    people = work / "people.json"
    people.write_text("{}")
    env = {**os.environ, "CLAIMS_FILE": str(people), "REDIRECT_URI": redirect_uri, "ISSUER_HOST": issuer_host}
    env |= {"CLIENT_ID": CLIENT_ID, "CLIENT_SECRET": CLIENT_SECRET}
    for attempt in (1, 2):
        process, port = started(work, env)
        if port or process.poll() is not None:
            break
        why = stopped_silent(process, work)
        if attempt == 2:
            pytest.fail(f"the OpenID Provider printed nothing in {STARTUP_S} s, twice. It was:\n{why}")
        warnings.warn(
            f"the OpenID Provider printed nothing in {STARTUP_S} s; starting it again. It was:\n{why}", stacklevel=3
        )
    try:
        if not port.isdigit():
            pytest.fail(f"the OpenID Provider did not start: {(work / 'provider.log').read_text()}")
        yield Provider(f"http://{issuer_host}:{port}", people)
    finally:
        process.terminate()
        process.communicate(timeout=10)
