"""Single sign-on in a real browser: chromium presses "Sign in with", signs in at a real OpenID Provider on another
site (localhost; the appliance is 127.0.0.1) and lands on the chat page signed in. The callback's page (not a
redirect) is what makes that work: a redirect chain begun on the provider's site is cross-site, and chromium would
not send the new SameSite=Strict session cookie along it."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import uvicorn

from tests.people.oidc.provider import CLIENT_ID, CLIENT_SECRET, running_provider
from tests.web.conftest import web_config
from tests.web.fakes import FakeEngineClient
from tests.web.server import free_port
from web.app import app_of, build_gateway
from web.db import create_db_engine, create_sessionmaker, sqlite_url, upgrade_schema
from web.keys.info import KeyLimits
from web.people.oidc.config import WELL_KNOWN, OidcConfig
from web.people.plans import Plans

if TYPE_CHECKING:
    from playwright.sync_api import Browser

expect = pytest.importorskip("playwright.sync_api").expect


async def with_plan(db: Path, name: str) -> None:
    """A migrated database holding the plan `name` (the admin API would check the admin password: seconds)."""
    engine = create_db_engine(sqlite_url(db))
    try:
        await upgrade_schema(engine)
        await Plans(create_sessionmaker(engine)).create(name, KeyLimits())
    finally:
        await engine.dispose()


@contextmanager
def gateway_served(db: Path, port: int, config: OidcConfig, plan: str) -> Iterator[str]:
    """The gateway (a fake engine: no model to start) with the plan `plan`, served by uvicorn in a thread (its own
    event loop: Playwright's sync API holds this thread's)."""
    app = app_of(build_gateway(web_config(db, oidc=config), FakeEngineClient()))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))

    async def serve() -> None:
        await with_plan(db, plan)
        await server.serve()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_person_signs_in_with_the_provider_and_lands_signed_in(browser: Browser, tmp_path: Path) -> None:
    port = free_port()
    callback = f"http://127.0.0.1:{port}/auth/oidc/callback"
    with running_provider(tmp_path, callback, issuer_host="localhost") as provider:
        provider.set_people({"u-zed": {"preferred_username": "zed", "groups": ["staff"]}})
        config = OidcConfig(
            provider.issuer + WELL_KNOWN, CLIENT_ID, CLIENT_SECRET, name="Test IdP", group_plans=(("staff", "staff"),)
        )
        with gateway_served(tmp_path / "appliance.db", port, config, plan="staff") as url:
            context = browser.new_context(base_url=url)
            context.set_default_timeout(20_000)
            context.route("https://**/*", lambda route: route.abort())  # the provider's page asks Google for fonts
            page = context.new_page()
            page.goto("/login")
            page.click("text=Sign in with Test IdP")
            page.fill("input[name=login]", "u-zed")  # the provider's own login form, then its consent form
            page.fill("input[name=password]", "any")
            page.click("button[type=submit]")
            page.click("button[type=submit]")
            page.wait_for_url(f"{url}/")
            page.goto("/account")
            assert page.url == f"{url}/account"
            expect(page.locator("body")).to_contain_text("zed")
            session = next(c for c in context.cookies() if c["name"] == "appliance_session")
            assert session["sameSite"] == "Strict" and session["httpOnly"]
            context.close()
