"""The console by person (issue 29): the history (page, CSV, admin API) filters by person and names the person of
each row, by their session or "via" one of their keys; the People page shows each person's requests and tokens
(their own /account numbers); the live panel shows a person's session and personal keys as one row, their name's;
and none of it opens to a person's session."""

from __future__ import annotations

import csv
import io
import re
import sqlite3
from typing import Any

from engine import TenantStats
from tests.security.conftest import Appliance, Session
from tests.web.conftest import ADMIN, MODEL
from web.console.auth import CSRF_FIELD, CSRF_HEADER

_NEW_KEY = re.compile(r'<code class="new-key">([^<]+)</code>')
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _own_key(appliance: Appliance, session: Session, name: str) -> str:
    page = appliance.post_form(session, "/account/keys", {"name": name, CSRF_FIELD: session.csrf})
    assert page.status_code == 201, page.text
    found = _NEW_KEY.search(page.text)
    assert found
    return found.group(1)


def _chat_by_key(appliance: Appliance, key: str) -> dict[str, Any]:
    appliance.http.cookies.clear()
    response = appliance.http.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _chat_by_session(appliance: Appliance, session: Session) -> dict[str, Any]:
    appliance.http.cookies.clear()
    headers = {"Cookie": f"appliance_session={session.cookie}", CSRF_HEADER: session.csrf}
    response = appliance.http.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _requests(appliance: Appliance, **params: Any) -> Any:
    return appliance.http.get("/admin/api/requests", params={"limit": 500, **params}, headers=ADMIN)


def test_the_history_filters_by_person_and_names_who_sent_each_row(appliance: Appliance) -> None:
    ann = appliance.new_person("hist-ann")
    bob = appliance.new_person("hist-bob")
    ann_session = appliance.person_signs_in("hist-ann")
    ann_key = _own_key(appliance, ann_session, "ann-laptop")
    sent = [_chat_by_session(appliance, ann_session)["id"], _chat_by_key(appliance, ann_key)["id"]]
    bobs = _chat_by_session(appliance, appliance.person_signs_in("hist-bob"))["id"]
    service = _chat_by_key(appliance, appliance.keys["user"])["id"]
    appliance.flush_history()

    page = _requests(appliance, user_id=ann)
    assert page.status_code == 200, page.text
    rows = {r["id"]: r for r in page.json()["data"]}
    assert sorted(rows) == sorted(sent) and page.json()["total"] == 2  # neither bob's nor the service key's
    assert {(r["user_id"], r["username"]) for r in rows.values()} == {(ann, "hist-ann")}
    assert rows[sent[0]]["key_id"] is None and rows[sent[1]]["key_id"] is not None
    assert [r["id"] for r in _requests(appliance, user_id=bob).json()["data"]] == [bobs]
    everyone = {r["id"]: r for r in _requests(appliance).json()["data"]}
    assert everyone[service]["user_id"] is None and everyone[service]["username"] is None
    one = appliance.http.get(f"/admin/api/requests/{bobs}", headers=ADMIN).json()
    assert one["username"] == "hist-bob"
    assert _requests(appliance, user_id=10**9).json() == {"data": [], "total": 0, "limit": 500, "offset": 0}
    for bad in ("ann", "1.5", str(2**63)):
        refused = _requests(appliance, user_id=bad)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "user_id", refused.text

    admin = appliance.sign_in()
    html = appliance.page(admin, f"/admin/history?person={ann}").text
    table = html[html.index('id="history-table"') :]
    assert table.count('class="person"') == 2 and "1–2 of 2 requests" in table
    assert "hist-bob" not in table and "via ann-laptop" in table and "<small>session</small>" in table
    assert f'<option value="{ann}" selected>hist-ann</option>' in html
    assert "unknown person" in appliance.page(admin, "/admin/history?person=nobody").text
    exported = appliance.page(admin, f"/admin/history.csv?person={ann}")
    assert exported.status_code == 200
    records = list(csv.DictReader(io.StringIO(exported.text)))
    assert sorted(r["id"] for r in records) == sorted(sent)
    assert {(r["username"], r["user_id"]) for r in records} == {("hist-ann", str(ann))}
    assert {r["key_name"] for r in records} == {"", "ann-laptop"}
    assert appliance.page(admin, "/admin/history.csv?person=x").status_code == 400
    detail = appliance.page(admin, f"/admin/history/{sent[1]}").text
    assert f'<a href="/admin/history?person={ann}">hist-ann</a>' in detail


def test_a_persons_session_reads_no_one_s_history(appliance: Appliance) -> None:
    victim = appliance.new_person("hist-victim")
    _chat_by_session(appliance, appliance.person_signs_in("hist-victim"))
    appliance.new_person("hist-snoop")
    snoop = appliance.person_signs_in("hist-snoop")
    appliance.flush_history()
    for path in (f"/admin/history?person={victim}", f"/admin/history.csv?person={victim}", "/admin/people"):
        page = appliance.page(snoop, path)
        assert page.status_code == 303 and page.headers["location"].startswith("/admin/login"), path
    api = appliance.page(snoop, f"/admin/api/requests?user_id={victim}")
    assert api.status_code == 401 and "hist-victim" not in api.text


def test_the_people_page_shows_each_persons_requests_and_tokens(appliance: Appliance) -> None:
    counted = appliance.new_person("tally")
    session = appliance.person_signs_in("tally")
    key = _own_key(appliance, session, "tally-key")
    answers = [_chat_by_session(appliance, session), _chat_by_key(appliance, key), _chat_by_key(appliance, key)]
    appliance.flush_history()
    tokens = sum(a["usage"]["total_tokens"] for a in answers)
    with sqlite3.connect(appliance.db_path) as db:
        stored = db.execute("SELECT total_requests, total_tokens FROM user_usage WHERE user_id = ?", (counted,))
        assert stored.fetchone() == (3, tokens)

    admin = appliance.sign_in()
    page = appliance.page(admin, "/admin/people").text
    row = page[page.index(f'id="person-{counted}"') :]
    row = row[: row.index("</article>")]
    metrics = dict(re.findall(r'data-metric="([^"]+)">([^<]*)<', row))
    assert metrics == {"person-requests": "3", "person-tokens": f"{tokens:,}"}, row
    assert f'href="/admin/history?person={counted}"' in row
    own = appliance.page(session, "/account").text  # the person's own page tells the same numbers
    assert f"3 requests, {tokens} tokens since your account was made" in own


def test_the_live_panel_shows_a_persons_session_and_keys_as_one_row_by_name(appliance: Appliance) -> None:
    person = appliance.new_person("live-lee")
    session = appliance.person_signs_in("live-lee")
    keys = [_own_key(appliance, session, "lee-phone"), _own_key(appliance, session, "lee-laptop")]
    before = set(appliance.fake.tenants)
    _chat_by_session(appliance, session)
    for key in keys:
        _chat_by_key(appliance, key)
    queued = [t for rid, t in appliance.fake.tenants.items() if rid not in before]
    assert len(queued) == 3 and all(t is not None for t in queued)
    assert {t.id for t in queued if t is not None} == {f"user:{person}"}  # one tenant: the engine's fair share

    appliance.fake.tenant_stats = [
        TenantStats(f"user:{person}", 1.0, "interactive", running=3, waiting=0, tokens_per_s=30.0, service=1.0),
    ]
    try:
        admin = appliance.sign_in()
        panel = appliance.page(admin, "/admin", **{"HX-Request": "true", "HX-Target": "key-shares"}).text
    finally:
        appliance.fake.tenant_stats = []
    assert panel.count("<tr data-key=") == 1 and '<tr data-key="live-lee">' in panel
    assert "lee-phone" not in panel and "lee-laptop" not in panel and f"user:{person}" not in panel
