"""People across two gateways on one PostgreSQL (issue 29): a session made on one gateway is valid on the other,
and signing out on one ends it on both; a person's quota is exact over both, whatever mix of sessions and personal
keys their requests come by, and the request beyond it is refused on either."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import asyncpg

from tests.postgres.conftest import fetch, gateways
from tests.web.conftest import ADMIN, InLoop
from web.console.auth import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE
from web.people.sessions import csrf_of

PASSWORD = "a person's long password"
CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
_FORM_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
_NEW_KEY = re.compile(r'<code class="new-key">([^<]+)</code>')


async def _new_person(via: InLoop, username: str, **fields: Any) -> int:
    made = await via.http.post(
        "/admin/api/users", json={"username": username, "password": PASSWORD, **fields}, headers=ADMIN
    )
    assert made.status_code == 201, made.text
    return int(made.json()["id"])


async def _sign_in(via: InLoop, username: str) -> str:
    """Sign in at /login as a browser does; returns the session cookie's value."""
    via.http.cookies.clear()
    page = await via.http.get("/login")
    token = _FORM_TOKEN.search(page.text)
    assert token, page.text
    form = {"username": username, "password": PASSWORD, CSRF_FIELD: token.group(1)}
    response = await via.http.post("/login", data=form, follow_redirects=False)
    assert response.status_code == 303, response.text
    via.http.cookies.clear()
    return str(response.cookies[SESSION_COOKIE])


def _as(session: str) -> dict[str, str]:
    return {"Cookie": f"{SESSION_COOKIE}={session}", CSRF_HEADER: csrf_of(session)}


async def _account(via: InLoop, session: str) -> int:
    """/account's status for the session: 200 while it lives, 303 (to /login) once it has ended."""
    via.http.cookies.clear()
    response = await via.http.get("/account", headers=_as(session), follow_redirects=False)
    assert response.status_code in (200, 303), response.text
    return response.status_code


async def _sign_out(via: InLoop, session: str, path: str) -> None:
    via.http.cookies.clear()
    response = await via.http.post(
        path, data={CSRF_FIELD: csrf_of(session)}, headers=_as(session), follow_redirects=False
    )
    assert response.status_code == 303 and response.headers["location"] == "/login", response.text


async def test_a_session_made_on_one_gateway_lives_and_ends_on_both(pg_url: str) -> None:
    async with gateways(pg_url, 2) as (a, b):
        await _new_person(a, "roamer")
        made_on_a, made_on_b, another_on_a = (
            await _sign_in(a, "roamer"),
            await _sign_in(b, "roamer"),
            await _sign_in(a, "roamer"),
        )
        assert [await _account(g, s) for g in (a, b) for s in (made_on_a, made_on_b)] == [200] * 4
        b.http.cookies.clear()
        chat = await b.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}, headers=_as(made_on_a))
        assert chat.status_code == 200, chat.text

        await _sign_out(a, made_on_a, "/logout")
        assert [await _account(g, made_on_a) for g in (a, b)] == [303, 303]
        b.http.cookies.clear()
        refused = await b.http.post("/v1/chat/completions", json=CHAT, headers=_as(made_on_a))
        assert refused.status_code == 401, refused.text
        assert await _account(b, made_on_b) == 200 and await _account(b, another_on_a) == 200  # only that one ended

        await _sign_out(b, made_on_b, "/logout-everywhere")
        assert [await _account(g, another_on_a) for g in (a, b)] == [303, 303]  # made on a, ended from b
    assert await fetch(pg_url, "SELECT id_hash FROM web_sessions") == []


async def _own_key(via: InLoop, session: str, name: str) -> str:
    via.http.cookies.clear()
    page = await via.http.post("/account/keys", data={"name": name, CSRF_FIELD: csrf_of(session)}, headers=_as(session))
    assert page.status_code == 201, page.text
    found = _NEW_KEY.search(page.text)
    assert found
    return found.group(1)


async def test_a_persons_quota_is_exact_over_two_gateways_sessions_and_keys(pg_url: str) -> None:
    async with gateways(pg_url, 2) as (a, b):
        for gateway in (a, b):
            await gateway.gateway.jobs.stop()  # the rollover job must not touch the usage counted here
            gateway.fake.token_delay = 0.005
        plan = await a.http.post(
            "/admin/api/plans", json={"name": "shared", "quota_tokens": 1000, "quota_period": "none"}, headers=ADMIN
        )
        assert plan.status_code == 201, plan.text
        person = await _new_person(b, "splitter", plan_id=plan.json()["id"])
        on_a, on_b = await _sign_in(a, "splitter"), await _sign_in(b, "splitter")
        key_from_a, key_from_b = await _own_key(a, on_a, "k-a"), await _own_key(b, on_b, "k-b")
        # Each way in, on each gateway: sessions made on either, keys made on either.
        ways = [
            _as(on_a),
            _as(on_b),
            {"Authorization": f"Bearer {key_from_a}"},
            {"Authorization": f"Bearer {key_from_b}"},
        ]
        body = {**CHAT, "max_tokens": 20, "ignore_eos": True}  # 19 + 20 = 39 tokens each

        async def one(i: int) -> tuple[int, int]:
            via = (a, b)[i % 2]
            response = await via.http.post("/v1/chat/completions", json=body, headers=ways[(i // 2) % 4])
            return response.status_code, response.json()["usage"]["total_tokens"] if response.status_code == 200 else 0

        for gateway in (a, b):
            gateway.http.cookies.clear()
        answers = await asyncio.gather(*(one(i) for i in range(60)))
        codes = [code for code, _ in answers]
        # 25 run whole (975 tokens), one more with the 25 left (6 after its prompt), the other 34 are refused.
        assert codes.count(200) == 26 and codes.count(429) == 34, codes
        answered = sum(tokens for _, tokens in answers)

        for gateway, way in ((a, ways[0]), (b, ways[1]), (a, ways[3]), (b, ways[2])):
            beyond = await gateway.http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1}, headers=way)
            assert beyond.status_code == 429 and beyond.json()["error"]["code"] == "insufficient_quota", beyond.text
        for gateway in (a, b):
            await gateway.gateway.writer.flush()

    (usage,) = await fetch(
        pg_url,
        "SELECT used_tokens, reserved_tokens, total_tokens, total_requests FROM user_usage WHERE user_id = $1",
        person,
    )
    assert usage["used_tokens"] == usage["total_tokens"] == answered == 1000
    assert usage["reserved_tokens"] == 0 and usage["total_requests"] == 26
    rows = await fetch(
        pg_url,
        "SELECT status, user_id, key_id, gateway, prompt_tokens + completion_tokens AS charged FROM requests",
    )
    assert len(rows) == 64 and {r["user_id"] for r in rows} == {person}
    assert sum(r["charged"] for r in rows if r["status"] == "finished") == answered
    finished = [r for r in rows if r["status"] == "finished"]
    assert {r["gateway"] for r in finished} == {"gateway-0", "gateway-1"}
    assert {r["key_id"] is None for r in finished} == {True, False}  # by sessions and by keys
    assert await fetch(pg_url, "SELECT used_tokens FROM key_usage WHERE used_tokens > 0") == []  # no key's own quota


@asynccontextmanager
async def holding_the_active_admins(url: str) -> AsyncIterator[Callable[[int], Awaitable[None]]]:
    """The active admins' rows locked FOR UPDATE on a connection of the test's own, until the block ends; yields
    a wait for that many other transactions queued on a lock."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        async with conn.transaction():
            await conn.fetch("SELECT id FROM users WHERE role = 'admin' AND NOT suspended FOR UPDATE")

            async def waiting(count: int) -> None:
                queued = (
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
                )
                for _ in range(500):
                    if await conn.fetchval(queued) >= count:
                        return
                    await asyncio.sleep(0.01)
                raise AssertionError(f"fewer than {count} transactions came to wait on the lock in 5 s")

            yield waiting
    finally:
        await conn.close()


def _basic(username: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{username}:{PASSWORD}".encode()).decode()}


async def test_two_admins_suspending_each_other_at_once_leave_one(pg_url: str) -> None:
    """y suspends x on one gateway while x suspends y on the other. The test holds the lock on the active admins
    until both requests wait on it, so both read the admins only after the lock: one goes through, the other sees
    it and is refused (409). Unheld, the loser may also come too late to sign in at all (401, x is suspended)."""
    async with gateways(pg_url, 2) as (a, b):
        x, y = await _new_person(a, "admin-x", role="admin"), await _new_person(a, "admin-y", role="admin")
        (seed,) = [
            p["id"] for p in (await a.http.get("/admin/api/users", headers=ADMIN)).json() if p["username"] == "admin"
        ]
        assert (
            await a.http.patch(f"/admin/api/users/{seed}", json={"role": "user"}, headers=_basic("admin-x"))
        ).status_code == 200

        async def at_once(held: bool) -> None:
            async with AsyncExitStack() as stack:
                if held:  # locked before either request starts
                    waiting = await stack.enter_async_context(holding_the_active_admins(pg_url))
                both = asyncio.gather(
                    a.http.patch(f"/admin/api/users/{x}", json={"suspended": True}, headers=_basic("admin-y")),
                    b.http.patch(f"/admin/api/users/{y}", json={"suspended": True}, headers=_basic("admin-x")),
                )
                if held:
                    await waiting(2)
            answers = await both
            codes = sorted(r.status_code for r in answers)
            assert codes == [200, 409] if held else codes in ([200, 409], [200, 401]), [r.text for r in answers]
            (refused,) = [r for r in answers if r.status_code != 200]
            assert refused.json()["error"]["code"] == {409: "last_admin", 401: "unauthorized"}[codes[1]], refused.text
            kept = "admin-y" if answers[0].status_code == 200 else "admin-x"
            restored = x if kept == "admin-y" else y
            back = await a.http.patch(f"/admin/api/users/{restored}", json={"suspended": False}, headers=_basic(kept))
            assert back.status_code == 200, back.text

        for _ in range(3):
            await at_once(held=True)
            await at_once(held=False)
    active = await fetch(pg_url, "SELECT username FROM users WHERE role = 'admin' AND NOT suspended ORDER BY username")
    assert [r["username"] for r in active] == ["admin-x", "admin-y"]
