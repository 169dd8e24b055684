"""A real OpenID Provider (provider.mjs, panva's oidc-provider from npm) started once per module, and a gateway
configured for it per test, driven by one httpx client that plays the browser: the gateway's host goes to the app
in this event loop, every other host (the provider) over the network."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import httpx
import pytest
import pytest_asyncio
from litestar import Litestar

from tests.people.oidc.provider import CLIENT_ID, CLIENT_SECRET, Provider, running_provider
from tests.web.conftest import lifespan, web_config
from tests.web.fakes import FakeEngineClient
from web.app import Gateway, app_of, build_gateway
from web.keys.info import KeyLimits
from web.people.oidc.config import WELL_KNOWN, OidcConfig

GATEWAY = "http://appliance"
CALLBACK = f"{GATEWAY}/auth/oidc/callback"
FORM_ACTION = re.compile(r'<form[^>]*action="([^"]+)"')
Rewrite = Callable[[str], str]


@pytest.fixture(scope="module")
def provider(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Provider]:
    with running_provider(tmp_path_factory.mktemp("oidc-provider"), CALLBACK) as running:
        yield running


def oidc_config(provider: Provider, **overrides: Any) -> OidcConfig:
    values: dict[str, Any] = {
        "discovery_url": provider.issuer + WELL_KNOWN,
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "name": "Test IdP",
        "group_plans": (("staff", "teachers"), ("students", "pupils")),
    }
    return OidcConfig(**(values | overrides))


@dataclass
class Site:
    """A gateway configured for the provider, its app running in the module's event loop."""

    gateway: Gateway
    app: Litestar
    plans: dict[str, int]

    def browser(self) -> httpx.AsyncClient:
        """A new browser (no cookies) that reaches this gateway at GATEWAY and the provider over the network."""
        mounts = {GATEWAY: httpx.ASGITransport(app=self.app, client=("10.1.2.3", 5555))}
        return httpx.AsyncClient(mounts=mounts, timeout=30)  # type: ignore[arg-type]


@asynccontextmanager
async def site_for(provider: Provider, db_path: Path, **oidc: Any) -> AsyncIterator[Site]:
    """A gateway for `provider` on a new database (the app migrates it at start) with the plans teachers and
    pupils. Starting an app costs about a second: the tests of a module share one per configuration."""
    gateway = build_gateway(web_config(db_path, oidc=oidc_config(provider, **oidc)), FakeEngineClient())
    app = app_of(gateway)
    async with lifespan(app):
        plans = {name: (await gateway.plans.create(name, KeyLimits())).id for name in ("teachers", "pupils")}
        yield Site(gateway, app, plans)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def site(provider: Provider, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Site]:
    """Staff get teachers, students pupils, anyone else is refused; the group `it` makes admins."""
    async with site_for(provider, tmp_path_factory.mktemp("site") / "a.db", admin_groups=frozenset({"it"})) as found:
        yield found


async def follow(browser: httpx.AsyncClient, response: httpx.Response, callback: Rewrite) -> httpx.Response:
    """Redirects followed as a browser does; the provider's redirect to the gateway's callback passes `callback`."""
    while response.is_redirect:
        target = urljoin(str(response.url), response.headers["location"])
        response = await browser.get(callback(target) if target.startswith(CALLBACK) else target)
    return response


async def sso_sign_in(
    browser: httpx.AsyncClient, login: str, *, authorize: Rewrite = str, callback: Rewrite = str
) -> httpx.Response:
    """Press "Sign in with", sign in at the provider's login form as `login`, consent, and come back: the
    gateway's last answer. `authorize` and `callback` may rewrite the two redirects, as an attacker could."""
    response = await browser.get(f"{GATEWAY}/auth/oidc/login")
    if not response.is_redirect:
        return response
    response = await browser.get(authorize(response.headers["location"]))
    for _ in range(4):
        response = await follow(browser, response, callback)
        if str(response.url).startswith(GATEWAY):
            return response
        action = FORM_ACTION.search(response.text)
        assert action is not None, response.text
        fields = {"prompt": "login", "login": login, "password": "any"} if 'name="login"' in response.text else {}
        response = await browser.post(urljoin(str(response.url), action.group(1)), data=fields or {"prompt": "consent"})
    raise AssertionError(f"the provider never sent the browser back: {response.text[:500]}")
