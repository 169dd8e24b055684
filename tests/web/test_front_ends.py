"""Trusted front ends (Open WebUI in front of the gateway): on a key marked as a front end, each request may name
its end user (X-OpenWebUI-User-Id > X-OpenWebUI-User-Email > the body's user / Anthropic's metadata.user_id), who
is then a fair-share tenant of their own with a quota of their own; with accounts on, the first of those names that
is an account runs as that person; an ordinary key's names change nothing."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

from engine import Tenant
from tests.security.conftest import serve
from tests.web.conftest import ADMIN, assert_openai_error, bearer, rows
from tests.web.fakes import FakeEngineClient

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
PROMPT_TOKENS = 22  # the fake tokenizer: one token per character of "<user>hello<assistant>"


async def key_of(client: Any, name: str = "webui", **fields: Any) -> tuple[int, str]:
    created = await client.post("/admin/api/keys", json={"name": name, **fields}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return created.json()["info"]["id"], created.json()["key"]


async def chat(client: Any, key: str, body: Any = None, **headers: str) -> Any:
    return await client.post("/v1/chat/completions", json=body or CHAT, headers={**bearer(key), **headers})


async def person(client: Any, username: str, role: str = "user", **fields: Any) -> int:
    body = {"username": username, "password": "a long enough password", "role": role, **fields}
    created = await client.post("/admin/api/users", json=body, headers=ADMIN)
    assert created.status_code == 201, created.text
    return int(created.json()["id"])


def last_tenant(fake: FakeEngineClient) -> Tenant:
    return list(fake.tenants.values())[-1]


async def test_the_id_header_wins_over_the_email_header_and_the_body(client: Any, fake: FakeEngineClient) -> None:
    key_id, key = await key_of(client, front_end=True)
    headers = {"X-OpenWebUI-User-Id": "u-1", "X-OpenWebUI-User-Email": "a@example.org"}
    assert (await chat(client, key, {**CHAT, "user": "body"}, **headers)).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:u-1"
    email_only = {"X-OpenWebUI-User-Email": "a@example.org", "X-OpenWebUI-User-Name": "Alice"}
    assert (await chat(client, key, {**CHAT, "user": "body"}, **email_only)).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:a@example.org"
    assert (await chat(client, key, {**CHAT, "user": "body"}, **{"X-OpenWebUI-User-Name": "Alice"})).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:body", "a display name names no one"
    assert (await chat(client, key)).status_code == 200
    assert last_tenant(fake).id == str(key_id), "a request that names no one is the key's"


async def test_anthropic_metadata_user_id_names_the_end_user(client: Any, fake: FakeEngineClient) -> None:
    key_id, key = await key_of(client, front_end=True)
    body = {"model": "fake-model", "max_tokens": 3, "messages": CHAT["messages"], "metadata": {"user_id": "claude-fan"}}
    answer = await client.post("/v1/messages", json=body, headers={"x-api-key": key})
    assert answer.status_code == 200, answer.text
    assert last_tenant(fake).id == f"fe:{key_id}:claude-fan"


async def test_a_bad_name_is_refused_in_the_dialects_shape(client: Any) -> None:
    _, key = await key_of(client, front_end=True)
    for headers, body in (
        ({"X-OpenWebUI-User-Id": "x" * 257}, CHAT),
        ({}, {**CHAT, "user": ""}),
        ({}, {**CHAT, "user": "tab\there"}),
        ({"X-OpenWebUI-User-Id": "   "}, CHAT),
    ):
        refused = await chat(client, key, body, **headers)
        assert_openai_error(refused, 400, param="user")
        assert refused.headers["x-should-retry"] == "false"
    body = {"model": "fake-model", "max_tokens": 3, "messages": CHAT["messages"], "metadata": {"user_id": "a\nb"}}
    refused = await client.post("/v1/messages", json=body, headers={"x-api-key": key})
    assert refused.status_code == 400 and refused.json()["type"] == "error", refused.text
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert refused.headers["x-should-retry"] == "false"


async def test_each_end_user_has_their_own_quota(client: Any, db: sqlite3.Connection) -> None:
    """One end user spends theirs; another is still served; the key's own counter is untouched."""
    key_id, key = await key_of(client, front_end=True, quota_tokens=PROMPT_TOKENS + 5, quota_period="day")
    spent = await chat(client, key, {**CHAT, "ignore_eos": True}, **{"X-OpenWebUI-User-Id": "greedy"})
    assert spent.status_code == 200, spent.text
    refused = await chat(client, key, **{"X-OpenWebUI-User-Id": "greedy"})
    error = assert_openai_error(refused, 429, "insufficient_quota")
    assert "end user 'greedy'" in error["message"]
    assert (await chat(client, key, **{"X-OpenWebUI-User-Id": "light"})).status_code == 200
    used = {r["name"]: r["used_tokens"] for r in rows(db, "SELECT name, used_tokens FROM end_users")}
    assert used == {"greedy": PROMPT_TOKENS + 5, "light": PROMPT_TOKENS + 5}
    (usage,) = rows(db, "SELECT used_tokens FROM key_usage WHERE key_id = ?", key_id)
    assert usage["used_tokens"] == 0
    named = rows(db, "SELECT e.name, r.status FROM requests r JOIN end_users e ON e.id = r.end_user_id ORDER BY 2")
    assert sorted((r["name"], r["status"]) for r in named) == [
        ("greedy", "finished"),
        ("greedy", "rejected"),
        ("light", "finished"),
    ]


async def test_the_end_user_plan_sets_their_limits_and_share(client: Any, fake: FakeEngineClient) -> None:
    plan = await client.post(
        "/admin/api/plans", json={"name": "webui people", "quota_tokens": 1000, "weight": 3}, headers=ADMIN
    )
    assert plan.status_code == 201, plan.text
    key_id, key = await key_of(client, front_end=True, front_end_plan_id=plan.json()["id"])
    assert (await chat(client, key, **{"X-OpenWebUI-User-Id": "ann"})).status_code == 200
    assert last_tenant(fake) == Tenant(f"fe:{key_id}:ann", 3.0, "interactive")
    listed = await client.get(f"/admin/api/keys/{key_id}/end-users", headers=ADMIN)
    assert listed.status_code == 200, listed.text
    (ann,) = listed.json()
    assert ann["name"] == "ann" and ann["total_requests"] == 1 and ann["last_used_at"] is not None
    history = await client.get(f"/admin/api/requests?end_user_id={ann['id']}", headers=ADMIN)
    assert [r["end_user_id"] for r in history.json()["data"]] == [ann["id"]]


async def test_accounts_are_matched_only_where_the_key_says_and_never_an_admin(
    client: Any, fake: FakeEngineClient, db: sqlite3.Connection
) -> None:
    alice = await person(client, "alice@example.org")
    await person(client, "boss", role="admin")
    key_id, key = await key_of(client, front_end=True)
    assert (await chat(client, key, **{"X-OpenWebUI-User-Email": "alice@example.org"})).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:alice@example.org", "matching is opt-in"
    await client.patch(f"/admin/api/keys/{key_id}", json={"front_end_accounts": True}, headers=ADMIN)
    assert (await chat(client, key, **{"X-OpenWebUI-User-Email": "Alice@example.org"})).status_code == 200
    assert last_tenant(fake).id == f"user:{alice}"
    (usage,) = rows(db, "SELECT used_tokens FROM user_usage WHERE user_id = ?", alice)
    assert usage["used_tokens"] > 0, "the person's own quota counts it"
    assert (await chat(client, key, **{"X-OpenWebUI-User-Id": "boss"})).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:boss", "an admin is never one header away"


async def test_an_account_is_matched_by_any_name_the_request_gives(client: Any, fake: FakeEngineClient) -> None:
    """Open WebUI sends its own uuid in X-OpenWebUI-User-Id with every request: the account is matched by the email
    header (or the body's user) all the same, and where no name is an account the first name is the end user."""
    alice = await person(client, "alice@example.org")
    bob = await person(client, "bob")
    await person(client, "boss@example.org", role="admin")
    key_id, key = await key_of(client, front_end=True, front_end_accounts=True)
    uuid = "0f8fad5b-d9cb-469f-a165-70867728950e"
    as_alice = {"X-OpenWebUI-User-Id": uuid, "X-OpenWebUI-User-Email": "Alice@example.org"}
    assert (await chat(client, key, **as_alice)).status_code == 200
    assert last_tenant(fake).id == f"user:{alice}"
    assert (await chat(client, key, {**CHAT, "user": "bob"}, **{"X-OpenWebUI-User-Id": uuid})).status_code == 200
    assert last_tenant(fake).id == f"user:{bob}", "the body's user is the last name tried"
    both = {"X-OpenWebUI-User-Id": "bob", "X-OpenWebUI-User-Email": "alice@example.org"}
    assert (await chat(client, key, **both)).status_code == 200
    assert last_tenant(fake).id == f"user:{bob}", "the first account in order wins"
    as_boss = {"X-OpenWebUI-User-Id": uuid, "X-OpenWebUI-User-Email": "boss@example.org"}
    assert (await chat(client, key, **as_boss)).status_code == 200
    assert last_tenant(fake).id == f"fe:{key_id}:{uuid}", "no account: the first name, never the admin"
    bad_email = {"X-OpenWebUI-User-Id": uuid, "X-OpenWebUI-User-Email": "x" * 257}
    assert_openai_error(await chat(client, key, **bad_email), 400, param="user")
    await client.patch(f"/admin/api/users/{alice}", json={"suspended": True}, headers=ADMIN)
    refused = await chat(client, key, **as_alice)
    assert refused.status_code == 401, refused.text


async def test_an_ordinary_key_ignores_names_and_spends_no_one_elses_quota(
    client: Any, fake: FakeEngineClient, db: sqlite3.Connection
) -> None:
    plan = await client.post("/admin/api/plans", json={"name": "tiny", "quota_tokens": 1}, headers=ADMIN)
    alice = await person(client, "alice", plan_id=plan.json()["id"])
    key_id, key = await key_of(client)
    for headers, body in (
        ({"X-OpenWebUI-User-Id": "alice"}, CHAT),
        ({"X-OpenWebUI-User-Email": "alice"}, CHAT),
        ({}, {**CHAT, "user": "alice"}),
        ({"X-OpenWebUI-User-Id": "x" * 300}, CHAT),  # not even checked: it means nothing here
    ):
        assert (await chat(client, key, body, **headers)).status_code == 200
        assert last_tenant(fake).id == str(key_id)
    assert rows(db, "SELECT * FROM user_usage WHERE user_id = ? AND used_tokens > 0", alice) == []
    assert rows(db, "SELECT * FROM end_users") == []
    (usage,) = rows(db, "SELECT used_tokens FROM key_usage WHERE key_id = ?", key_id)
    assert usage["used_tokens"] > 0
    assert {r["user_id"] for r in rows(db, "SELECT user_id FROM requests")} == {None}


async def test_the_front_end_settings_round_trip_and_a_missing_plan_is_refused(client: Any) -> None:
    key_id, _ = await key_of(client)
    missing = await client.patch(f"/admin/api/keys/{key_id}", json={"front_end_plan_id": 999}, headers=ADMIN)
    assert_openai_error(missing, 404, param="front_end_plan_id")
    changed = await client.patch(f"/admin/api/keys/{key_id}", json={"front_end": True}, headers=ADMIN)
    assert changed.status_code == 200, changed.text
    view = changed.json()
    assert (view["front_end"], view["front_end_accounts"], view["front_end_plan_id"]) == (True, False, None)
    gone = await client.get("/admin/api/keys/424242/end-users", headers=ADMIN)
    assert gone.status_code == 404


def test_the_console_form_makes_a_front_end_and_its_page_lists_end_users(tmp_path: Path) -> None:
    with serve(tmp_path) as appliance:
        session = appliance.sign_in()
        form = {"name": "webui", "quota_period": "none", "front_end": "on", "csrf_token": session.csrf}
        assert appliance.post_form(session, "/admin/keys", form).status_code == 201
        (view,) = appliance.http.get("/admin/api/keys", headers=ADMIN).json()
        assert (view["front_end"], view["front_end_accounts"]) == (True, False)
        other_id, _ = appliance.new_key("other")
        edit = appliance.page(session, f"/admin/keys/{view['id']}/edit", **{"HX-Request": "true"}).text
        assert re.search(r'name="front_end" value="on"\s+checked', edit)
        plain = {k: v for k, v in form.items() if k != "front_end"}
        htmx = {"HX-Request": "true", "X-CSRF-Token": session.csrf}
        assert appliance.post_form(session, f"/admin/keys/{view['id']}", plain, **htmx).status_code == 200
        assert appliance.http.get(f"/admin/api/keys/{view['id']}", headers=ADMIN).json()["front_end"] is False
        assert appliance.post_form(session, f"/admin/keys/{view['id']}", form, **htmx).status_code == 200

        webui = appliance.http.get("/admin/api/keys", headers=ADMIN).json()[0]
        assert webui["front_end"] is True
        secret = appliance.http.post("/admin/api/keys", json={"name": "fe", "front_end": True}, headers=ADMIN)
        headers = {"Authorization": f"Bearer {secret.json()['key']}", "X-OpenWebUI-User-Id": "<b>eve</b>"}
        assert appliance.http.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        fe_id = secret.json()["info"]["id"]
        page = appliance.page(session, f"/admin/keys/{fe_id}/end-users")
        assert page.status_code == 200 and "&lt;b&gt;eve&lt;/b&gt;" in page.text and "<b>eve" not in page.text
        assert f"/admin/history?key={fe_id}&amp;end_user=" in page.text
        cards = appliance.page(session, "/admin/keys").text
        assert f'href="/admin/keys/{fe_id}/end-users"' in cards
        other = re.search(rf'<article id="key-{other_id}".*?</article>', cards, re.S)
        assert other and "end-users" not in other.group(0), "an ordinary key's card links to no end users"


def test_a_crash_leaves_no_reservation_on_the_end_user(tmp_path: Path) -> None:
    """Recovery settles a request left running on the quota it reserved: its end user's, not its key's."""
    with serve(tmp_path) as appliance:
        key_id, key = appliance.new_key("webui", front_end=True, quota_tokens=1000)
        headers = {**bearer(key), "X-OpenWebUI-User-Id": "crashed"}
        assert appliance.http.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        appliance.flush_history()
        with sqlite3.connect(appliance.db_path) as db:
            db.execute(
                "UPDATE requests SET status = 'running', reserved_tokens = 50, completion_tokens = 3, gateway = NULL"
            )
            db.execute("UPDATE end_users SET reserved_tokens = reserved_tokens + 50")
            (before,) = db.execute("SELECT used_tokens FROM end_users").fetchone()
        assert appliance.http.blocking_portal.call(appliance.gateway.ledger.recover) == 1
        with sqlite3.connect(appliance.db_path) as db:
            used, reserved = db.execute("SELECT used_tokens, reserved_tokens FROM end_users").fetchone()
            (key_used,) = db.execute("SELECT used_tokens FROM key_usage WHERE key_id = ?", (key_id,)).fetchone()
        assert reserved == 0 and used > before and key_used == 0
