"""Single sign-on against a real OpenID Provider: groups give plans, the first sign-in makes the account (linked by
issuer and sub, a taken name avoided), a removed group demotes at the next sign-in, and a forged state, a replayed
nonce or another issuer is refused with the sign-in page's reason and no session."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest
from sqlalchemy import select

from tests.people.oidc.conftest import GATEWAY, Site, site_for, sso_sign_in
from tests.people.oidc.provider import Provider
from tests.web.conftest import ADMIN_PASSWORD
from web.models import OidcIdentity, User, WebSession
from web.people.oidc.config import WELL_KNOWN

pytestmark = pytest.mark.asyncio(loop_scope="module")  # the provider and the sites are the module's

STAFF = {"preferred_username": "Alice", "email": "alice@school.example", "groups": ["students", "staff"]}


def with_param(url: str, name: str, value: str | None) -> str:
    """`url` with its query parameter `name` set to `value` (None: removed)."""
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != name] + ([(name, value)] if value is not None else [])
    return urlunsplit(parts._replace(query=urlencode(query)))


async def people(site: Site) -> dict[str, tuple[int, int | None, str]]:
    """username -> (id, plan_id, role)."""
    async with site.gateway.sessions() as session:
        rows = await session.execute(select(User.username, User.id, User.plan_id, User.role))
    return {name: (id_, plan, role) for name, id_, plan, role in rows}


async def links(site: Site, subject: str) -> list[tuple[str, int]]:
    """(issuer, user id) of each account linked to `subject`."""
    async with site.gateway.sessions() as session:
        rows = await session.execute(
            select(OidcIdentity.issuer, OidcIdentity.user_id).where(OidcIdentity.subject == subject)
        )
    return [tuple(row) for row in rows]  # type: ignore[misc]


async def session_count(site: Site) -> int:
    async with site.gateway.sessions() as session:
        return len((await session.scalars(select(WebSession.id_hash))).all())


async def account(browser: httpx.AsyncClient) -> httpx.Response:
    return await browser.get(f"{GATEWAY}/account")


def assert_refused(response: httpx.Response, status: int, reason: str) -> None:
    assert response.status_code == status, response.text
    assert "Single sign-on failed" in response.text and reason in response.text, response.text
    assert not response.cookies.get("appliance_session")


async def test_groups_give_plans_and_the_first_sign_in_makes_a_linked_account(provider: Provider, site: Site) -> None:
    provider.set_people({"u-alice": STAFF, "u-bob": {"preferred_username": "bob", "groups": ["students"]}})
    await site.gateway.accounts.insert("bob", "!", "user", None)  # a local bob holds the name
    async with site.browser() as browser:
        login_page = await browser.get(f"{GATEWAY}/login")
        assert 'href="/auth/oidc/login">Sign in with Test IdP<' in login_page.text
        signed_in = await sso_sign_in(browser, "u-alice")
        assert signed_in.status_code == 200 and "Signed in" in signed_in.text
        page = await account(browser)
        assert page.status_code == 200 and "alice" in page.text
    async with site.browser() as browser:
        await sso_sign_in(browser, "u-bob")

    found = await people(site)
    # alice is in students and staff: staff is mapped first, so she gets teachers.
    assert found["alice"][1:] == (site.plans["teachers"], "user")
    assert found["bob-2"][1:] == (site.plans["pupils"], "user")
    assert await links(site, "u-alice") == [(provider.issuer, found["alice"][0])]
    assert await links(site, "u-bob") == [(provider.issuer, found["bob-2"][0])]
    # Signing in again is the same account, however the name changes at the provider.
    provider.set_people({"u-alice": {**STAFF, "preferred_username": "alice.renamed"}})
    async with site.browser() as browser:
        await sso_sign_in(browser, "u-alice")
        assert "alice" in (await account(browser)).text
    assert set(await people(site)) == set(found)
    # The password sign-in still works beside it.
    async with site.browser() as browser:
        form = await browser.get(f"{GATEWAY}/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', form.text)
        assert token is not None
        fields = {"username": "admin", "password": ADMIN_PASSWORD, "csrf_token": token.group(1)}
        assert (await browser.post(f"{GATEWAY}/login", data=fields)).status_code == 303
        assert (await browser.get(f"{GATEWAY}/admin")).status_code == 200


async def test_a_removed_group_demotes_at_the_next_sign_in(provider: Provider, site: Site) -> None:
    provider.set_people({"u-carol": {"preferred_username": "carol", "groups": ["staff", "it"]}})
    async with site.browser() as browser:
        await sso_sign_in(browser, "u-carol")
        assert (await people(site))["carol"][1:] == (site.plans["teachers"], "admin")
        assert (await browser.get(f"{GATEWAY}/admin")).status_code == 200  # the console, as an admin
    provider.set_people({"u-carol": {"preferred_username": "carol", "groups": ["students"]}})
    async with site.browser() as browser:
        await sso_sign_in(browser, "u-carol")
        assert (await people(site))["carol"][1:] == (site.plans["pupils"], "user")
        assert (await browser.get(f"{GATEWAY}/admin")).status_code == 303  # no console any more


async def test_a_person_in_no_mapped_group_is_refused_unless_a_plan_is_set_for_them(
    provider: Provider, site: Site, tmp_path: Path
) -> None:
    provider.set_people({"u-dave": {"preferred_username": "dave", "groups": ["visitors"]}})
    sessions = await session_count(site)
    async with site.browser() as browser:
        assert_refused(await sso_sign_in(browser, "u-dave"), 403, "in no group that may use this appliance")
        assert (await account(browser)).status_code == 303
    assert "dave" not in await people(site) and await session_count(site) == sessions
    async with site_for(provider, tmp_path / "open.db", unmapped_plan="pupils") as open_site:
        async with open_site.browser() as browser:
            await sso_sign_in(browser, "u-dave")
        assert (await people(open_site))["dave"][1] == open_site.plans["pupils"]


async def test_a_forged_state_is_refused(provider: Provider, site: Site) -> None:
    provider.set_people({"u-erin": {"preferred_username": "erin", "groups": ["staff"]}})
    sessions = await session_count(site)
    async with site.browser() as browser:
        response = await sso_sign_in(browser, "u-erin", callback=lambda url: with_param(url, "state", "forged"))
        assert_refused(response, 400, "not started here")
        assert (await account(browser)).status_code == 303
    assert "erin" not in await people(site) and await session_count(site) == sessions


async def test_an_id_token_for_another_nonce_is_refused(provider: Provider, site: Site) -> None:
    """The provider signs a token for the nonce it was given; this browser's sign-in expected its own."""
    provider.set_people({"u-frank": {"preferred_username": "frank", "groups": ["staff"]}})
    sessions = await session_count(site)
    async with site.browser() as browser:
        response = await sso_sign_in(browser, "u-frank", authorize=lambda url: with_param(url, "nonce", "replayed"))
        assert_refused(response, 403, "Invalid claim &#39;nonce&#39;")
    assert "frank" not in await people(site) and await session_count(site) == sessions


async def test_another_issuer_is_refused(provider: Provider, tmp_path: Path) -> None:
    """A discovery document naming another issuer than the provider's tokens carry: refused by the answer's iss
    parameter (RFC 9207), and by the ID token's iss where the answer has none."""
    provider.set_people({"u-gina": {"preferred_username": "gina", "groups": ["staff"]}})
    tampered = f"{provider.issuer}/tampered{WELL_KNOWN}"
    async with site_for(provider, tmp_path / "tampered.db", discovery_url=tampered) as site:
        async with site.browser() as browser:
            assert_refused(await sso_sign_in(browser, "u-gina"), 403, "its issuer differs")
            response = await sso_sign_in(browser, "u-gina", callback=lambda url: with_param(url, "iss", None))
            assert_refused(response, 403, "Invalid claim &#39;iss&#39;")
        assert "gina" not in await people(site) and await session_count(site) == 0
