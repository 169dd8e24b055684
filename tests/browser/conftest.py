"""Fixtures for the browser tests: a real appliance (random tiny model) started once on a free port, Debian's
chromium driven by Playwright, a signed-in console page, and keys made through the admin API."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from web.static import VENDOR_DIR
from web.static.assets import ASSETS, is_current

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page

REPO = Path(__file__).resolve().parents[2]
# Every run writes its screenshots here (git-ignored); the README shows copies committed under docs/screenshots.
SCREENSHOTS = REPO / "artifacts" / "screenshots"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
ADMIN_PASSWORD = "browser-tests-admin-password"
START_TIMEOUT_S = 180


@dataclass(frozen=True)
class Server:
    url: str
    log: Path

    def admin(self) -> httpx.Client:
        """The admin JSON API (HTTP Basic), for setting up what a test needs."""
        return httpx.Client(base_url=self.url, auth=("admin", ADMIN_PASSWORD), timeout=30)

    def new_key(self, name: str = "browser", **limits: Any) -> str:
        with self.admin() as api:
            response = api.post("/admin/api/keys", json={"name": name, **limits})
        assert response.status_code == 201, response.text
        return str(response.json()["key"])

    def requests(self, **filters: Any) -> list[dict[str, Any]]:
        with self.admin() as api:
            response = api.get("/admin/api/requests", params=filters)
        assert response.status_code == 200, response.text
        return list(response.json()["data"])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the appliance exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"the appliance was not ready within {START_TIMEOUT_S} s:\n{log.read_text()[-3000:]}")


def missing_assets() -> list[str]:
    return [a.target for a in ASSETS if not is_current(a, VENDOR_DIR)]


@contextmanager
def appliance(data: Path, **settings: str) -> Iterator[Server]:
    """The appliance served from `data` on a free port, with the browser tests' settings (random tiny model unless
    `settings` say otherwise: APPLIANCE_* names), killed at the end (its engine process exits when its pipe closes)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("APPLIANCE_")}
    env.update(
        APPLIANCE_MODEL="random:tiny",
        APPLIANCE_QUANTIZATION="none",
        APPLIANCE_DEVICE="cpu",
        APPLIANCE_DATA_DIR=str(data),
        APPLIANCE_ADMIN_PASSWORD=ADMIN_PASSWORD,
        APPLIANCE_HOST="127.0.0.1",
        APPLIANCE_PORT=str(port),
        APPLIANCE_STORE_TEXT="true",
        APPLIANCE_NUM_KV_BLOCKS="512",  # small enough that a few requests show on the KV gauge
        APPLIANCE_DRAIN_TIMEOUT="1",
        APPLIANCE_LOG_LEVEL="warning",
        APPLIANCE_EMBEDDING_MODEL="none",  # no page embeds; a process less per server
    )
    env.update(settings)
    log = data / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "appliance.cli.main", "serve"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, process, log)
        yield Server(url, log)
    finally:
        process.kill()  # nothing checks how it stops: SIGKILL spares the graceful stop's seconds
        process.wait()


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    missing = missing_assets()
    if missing:
        pytest.fail(f"front-end assets not fetched ({', '.join(missing)}): run `python -m web.static.assets`")
    with appliance(tmp_path_factory.mktemp("appliance")) as served:
        yield served


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not CHROMIUM.exists():
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    # expect()'s own default is 5 s, the actions' (new_context) 15 s: a reply from the appliance on the 2-core box,
    # with the other lane loading it, once took longer than 5 s to show (the quota refusal in test_people.py).
    sync_api.expect.set_options(timeout=15_000)
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class PageProblems:
    """Script errors and Content-Security-Policy refusals seen by a page: a test fails on any of them."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def watch(self, page: Page) -> None:
        page.on("pageerror", lambda exc: self.errors.append(f"page error: {exc}"))
        page.on("console", self._console)

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error" and ("Content Security Policy" in message.text or "Uncaught" in message.text):
            self.errors.append(f"console: {message.text}")


def new_context(browser: Browser, server: Server, **options: Any) -> BrowserContext:
    options.setdefault("viewport", {"width": 1280, "height": 860})
    context = browser.new_context(base_url=server.url, **options)
    context.set_default_timeout(15_000)
    return context


@pytest.fixture
def context(browser: Browser, server: Server) -> Iterator[BrowserContext]:
    context = new_context(browser, server)
    yield context
    context.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    problems = PageProblems()
    page = context.new_page()
    problems.watch(page)
    yield page
    assert not problems.errors, problems.errors


def sign_in(page: Page, password: str = ADMIN_PASSWORD) -> None:
    page.goto("/admin/login")
    page.fill("input[name=password]", password)
    page.click("form button[type=submit]")


@pytest.fixture
def console(page: Page) -> Page:
    """A page signed in to the admin console, on the dashboard."""
    sign_in(page)
    page.wait_for_url("**/admin")
    return page
