"""The chat page with a session instead of a key: a signed-in person's page carries their CSRF token (and no key);
/v1/chat/completions and /v1/models take the session with that token in X-CSRF-Token, and nothing else (no token,
another session's token, a form post, another /v1 route); the request runs under the person's plan, counts against
their quota, as the person's tenant; after sign-out the same browser's page names no one."""

from __future__ import annotations

import re
import sqlite3

from engine import Tenant
from tests.security.conftest import Appliance
from tests.web.conftest import ADMIN, MODEL
from web.console.auth import CSRF_FIELD, CSRF_HEADER, SESSION_COOKIE

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')


def test_a_signed_in_page_chats_with_its_session_and_its_token_only(appliance: Appliance) -> None:
    plan = appliance.http.post("/admin/api/plans", json={"name": "chatters", "weight": 3.0}, headers=ADMIN).json()
    person = appliance.new_person("chatter", plan_id=plan["id"])
    other = appliance.new_person("bystander")
    session, bystander = appliance.person_signs_in("chatter"), appliance.person_signs_in("bystander")
    page = appliance.page(session, "/")
    token = _META.search(page.text)
    assert token and token.group(1) == session.csrf and "chatter" in page.text
    assert page.headers["cache-control"] == "no-store"
    cookie = {"Cookie": f"{SESSION_COOKIE}={session.cookie}"}

    def chat(path: str = "/v1/chat/completions", **headers: str) -> object:
        appliance.http.cookies.clear()
        return appliance.http.post(path, json=CHAT, headers=headers)

    answered = chat(**cookie, **{CSRF_HEADER: session.csrf})
    assert answered.status_code == 200, answered.text  # type: ignore[attr-defined]
    assert list(appliance.fake.tenants.values())[-1] == Tenant(f"user:{person}", 3.0, "interactive")
    appliance.http.cookies.clear()
    models = appliance.http.get("/v1/models", headers={**cookie, CSRF_HEADER: session.csrf})
    assert models.status_code == 200 and models.json()["data"][0]["id"] == MODEL
    for forged in ({}, {CSRF_HEADER: "forged"}, {CSRF_HEADER: bystander.csrf}, {CSRF_HEADER: session.csrf[:-1]}):
        refused = chat(**cookie, **forged)
        assert refused.status_code == 401, forged  # type: ignore[attr-defined]
        assert refused.headers["x-should-retry"] == "false"  # type: ignore[attr-defined]
    appliance.http.cookies.clear()
    form = appliance.http.post("/v1/chat/completions", data={CSRF_FIELD: session.csrf, "model": MODEL}, headers=cookie)
    assert form.status_code == 401, "a form (what another site can post) never carries the header"
    elsewhere = chat("/v1/completions", **cookie, **{CSRF_HEADER: session.csrf})
    assert elsewhere.status_code == 401, "only the chat page's routes take a session"  # type: ignore[attr-defined]
    appliance.flush_history()
    with sqlite3.connect(appliance.db_path) as db:
        rows = db.execute("SELECT key_id, user_id, status FROM requests WHERE user_id IN (?, ?)", (person, other))
        assert rows.fetchall() == [(None, person, "finished")]
        used = db.execute("SELECT used_tokens FROM user_usage WHERE user_id = ?", (person,)).fetchone()[0]
    assert used > 0

    assert appliance.post_form(session, "/logout", {CSRF_FIELD: session.csrf}).status_code == 303
    assert chat(**cookie, **{CSRF_HEADER: session.csrf}).status_code == 401  # type: ignore[attr-defined]
    after = appliance.page(session, "/")
    assert "chatter" not in after.text and not _META.search(after.text) and 'id="sign-in"' in after.text
