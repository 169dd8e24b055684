"""Plans and personal keys over HTTP in-process: a person's keys carry their plan (cap, quota and period,
concurrency, weight, class, models) and their own overrides, count against one quota that all their keys share,
and reach the engine as one tenant, the person; a person makes and revokes only their own keys (every other id is
the same 404 and changes nothing), with the session's CSRF token; a suspended person's keys stop working."""

from __future__ import annotations

import re
import sqlite3
from typing import Any

from engine import Tenant
from tests.security.conftest import Appliance, Session
from tests.web.conftest import ADMIN, MODEL
from web.console.auth import CSRF_FIELD

_NEW_KEY = re.compile(r'<code class="new-key">([^<]+)</code>')
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _plan(appliance: Appliance, name: str, **limits: Any) -> int:
    response = appliance.http.post("/admin/api/plans", json={"name": name, **limits}, headers=ADMIN)
    assert response.status_code == 201, response.text
    return int(response.json()["id"])


def _own_key(appliance: Appliance, session: Session, name: str = "laptop") -> str:
    page = appliance.post_form(session, "/account/keys", {"name": name, CSRF_FIELD: session.csrf})
    assert page.status_code == 201, page.text
    found = _NEW_KEY.search(page.text)
    assert found
    return found.group(1)


def _chat(appliance: Appliance, key: str, **body: Any) -> Any:
    appliance.http.cookies.clear()
    return appliance.http.post(
        "/v1/chat/completions", json={**CHAT, **body}, headers={"Authorization": f"Bearer {key}"}
    )


def _usage(appliance: Appliance, table: str, column: str, owner: int) -> tuple[int, int]:
    appliance.flush_history()
    with sqlite3.connect(appliance.db_path) as db:
        row = db.execute(f"SELECT used_tokens, reserved_tokens FROM {table} WHERE {column} = ?", (owner,)).fetchone()
    return (row[0], row[1]) if row else (0, 0)


def test_a_persons_keys_carry_their_plan_and_share_their_quota(appliance: Appliance) -> None:
    plan = _plan(
        appliance,
        "classroom",
        quota_tokens=40,
        quota_period="day",
        max_tokens_per_request=6,
        weight=2.0,
        priority="batch",
    )
    person = appliance.new_person("pupil", plan_id=plan)
    session = appliance.person_signs_in("pupil")
    first, second = _own_key(appliance, session, "one"), _own_key(appliance, session, "two")
    assert first != second and first.encode() not in appliance.db_path.read_bytes()

    over_cap = _chat(appliance, first, max_tokens=7)  # the plan's cap applies: the ask runs trimmed to it
    assert over_cap.status_code == 200 and over_cap.headers["x-max-tokens-trimmed-to"] == "6", over_cap.text
    person_tenant = Tenant(f"user:{person}", 2.0, "batch")  # the person, not the key, with the plan's share
    assert list(appliance.fake.tenants.values())[-1] == person_tenant

    used, reserved = _usage(appliance, "user_usage", "user_id", person)
    assert used > 0 and reserved == 0
    spent_by_keys = sum(_usage(appliance, "key_usage", "key_id", k["id"])[0] for k in _keys_of(appliance, person))
    assert spent_by_keys == 0, "a personal key's tokens count against its person, not the key"
    while _chat(appliance, second).status_code == 200:  # the other key draws on the same quota
        assert list(appliance.fake.tenants.values())[-1] == person_tenant
    refused = _chat(appliance, first)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "insufficient_quota"
    assert _usage(appliance, "user_usage", "user_id", person)[0] <= 40
    with sqlite3.connect(appliance.db_path) as db:
        rows = db.execute(
            "SELECT DISTINCT user_id FROM requests WHERE key_id IN (SELECT id FROM api_keys WHERE user_id = ?)",
            (person,),
        ).fetchall()
    assert rows == [(person,)], "each row names the person it counted against"


def _keys_of(appliance: Appliance, person: int) -> list[dict[str, Any]]:
    with sqlite3.connect(appliance.db_path) as db:
        return [{"id": r[0]} for r in db.execute("SELECT id FROM api_keys WHERE user_id = ?", (person,))]


def test_overrides_and_models_and_suspension(appliance: Appliance) -> None:
    plan = _plan(appliance, "narrow", allowed_models=["some-other-model"])
    person = appliance.new_person("narrowed", plan_id=plan)
    key = _own_key(appliance, appliance.person_signs_in("narrowed"))
    refused = _chat(appliance, key)
    assert refused.status_code == 404 and "your plan does not include" in refused.json()["error"]["message"]
    widened = appliance.http.patch(
        f"/admin/api/users/{person}",
        json={"overrides": {"allowed_models": [], "max_tokens_per_request": 3}},
        headers=ADMIN,
    )
    assert widened.status_code == 200, widened.text
    assert _chat(appliance, key, max_tokens=4).headers["x-max-tokens-trimmed-to"] == "3"  # the person's own cap
    assert _chat(appliance, key, max_tokens=3).status_code == 200
    bad = appliance.http.patch(f"/admin/api/users/{person}", json={"overrides": {"weight": -1}}, headers=ADMIN)
    assert bad.status_code == 400
    bad = appliance.http.patch(f"/admin/api/users/{person}", json={"overrides": {"colour": 1}}, headers=ADMIN)
    assert bad.status_code == 400
    appliance.http.patch(f"/admin/api/users/{person}", json={"suspended": True}, headers=ADMIN)
    assert _chat(appliance, key).status_code == 401
    appliance.http.patch(f"/admin/api/users/{person}", json={"suspended": False}, headers=ADMIN)
    assert _chat(appliance, key, max_tokens=3).status_code == 200


def test_a_person_sees_and_revokes_only_their_own_keys(appliance: Appliance) -> None:
    appliance.new_person("owner")
    appliance.new_person("intruder")
    owner, intruder = appliance.person_signs_in("owner"), appliance.person_signs_in("intruder")
    key = _own_key(appliance, owner, "owners-key")
    _own_key(appliance, intruder, "intruders-key")
    service_key_id, service_key = appliance.new_key("a service's key")
    owners_page = appliance.page(owner, "/account").text
    assert "owners-key" in owners_page and "intruders-key" not in owners_page and "a service" not in owners_page
    assert key not in owners_page, "a key is shown once, when made"
    with sqlite3.connect(appliance.db_path) as db:
        top = db.execute("SELECT max(id) FROM api_keys").fetchone()[0]
        mine = {
            r[0]
            for r in db.execute(
                "SELECT k.id FROM api_keys k JOIN users u ON u.id = k.user_id WHERE u.username = 'intruder'"
            )
        }
    for key_id in range(1, top + 3):
        if key_id in mine:
            continue
        response = appliance.post_form(intruder, f"/account/keys/{key_id}/revoke", {CSRF_FIELD: intruder.csrf})
        assert response.status_code == 404, (key_id, response.status_code)
        assert "intruders-key" not in response.text
    assert _chat(appliance, key).status_code == 200 and _chat(appliance, service_key).status_code == 200
    (owners_id,) = [
        r["id"] for r in appliance.http.get("/admin/api/keys", headers=ADMIN).json() if r["name"] == "owners-key"
    ]
    for forged in ({}, {CSRF_FIELD: intruder.csrf}, {CSRF_FIELD: "forged"}):
        assert appliance.post_form(owner, f"/account/keys/{owners_id}/revoke", forged).status_code == 403
        assert appliance.post_form(owner, "/account/keys", {"name": "forged", **forged}).status_code == 403
    assert _chat(appliance, key).status_code == 200
    anonymous = appliance.post_form(None, f"/account/keys/{owners_id}/revoke", {})
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login")
    assert appliance.page(None, "/account").status_code == 303
    revoked = appliance.post_form(owner, f"/account/keys/{owners_id}/revoke", {CSRF_FIELD: owner.csrf})
    assert revoked.status_code == 303
    assert _chat(appliance, key).status_code == 401
    assert service_key_id not in mine


def test_a_crash_leaves_no_reservation_on_the_person(appliance: Appliance) -> None:
    """Recovery settles a request left running on the quota it reserved: its person's, not its key's."""
    person = appliance.new_person("crashed", plan_id=_plan(appliance, "crash-plan", quota_tokens=1000))
    key = _own_key(appliance, appliance.person_signs_in("crashed"))
    assert _chat(appliance, key).status_code == 200
    before = _usage(appliance, "user_usage", "user_id", person)
    with sqlite3.connect(appliance.db_path) as db:
        db.execute(
            "UPDATE requests SET status = 'running', reserved_tokens = 50, completion_tokens = 3, gateway = NULL "
            "WHERE user_id = ?",
            (person,),
        )
        db.execute("UPDATE user_usage SET reserved_tokens = reserved_tokens + 50 WHERE user_id = ?", (person,))
    assert appliance.http.blocking_portal.call(appliance.gateway.ledger.recover) == 1
    used, reserved = _usage(appliance, "user_usage", "user_id", person)
    assert reserved == before[1] == 0 and used > before[0]  # released, and what reached the client charged
    with sqlite3.connect(appliance.db_path) as db:
        assert db.execute("SELECT status FROM requests WHERE user_id = ?", (person,)).fetchone()[0] == "interrupted"


def test_the_dashboards_fair_share_panel_names_a_person_not_a_key(appliance: Appliance) -> None:
    from engine import TenantStats

    person = appliance.new_person("panel-person")
    appliance.fake.tenant_stats = [
        TenantStats(f"user:{person}", 2.0, "interactive", running=3, waiting=1, tokens_per_s=50.0, service=1.0)
    ]
    try:
        admin = appliance.sign_in()
        panel = appliance.page(admin, "/admin", **{"HX-Request": "true", "HX-Target": "key-shares"})
    finally:
        appliance.fake.tenant_stats = []
    assert panel.status_code == 200 and "panel-person" in panel.text and f"user:{person}" not in panel.text
