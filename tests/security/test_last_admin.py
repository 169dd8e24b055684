"""The last active admin stays one: the admin API refuses to suspend, demote or delete them (409 last_admin, in the
API's error shape, not to be retried), the console shows why, a suspended admin does not count as active, and
anyone else may be changed or deleted (their keys and sessions go with them; their history stays, naming no one)."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path
from typing import Any

from tests.security.conftest import Appliance, serve
from tests.web.conftest import ADMIN, ADMIN_PASSWORD, MODEL, assert_openai_error
from web.console.auth import CSRF_FIELD, CSRF_HEADER

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _people(appliance: Appliance, headers: dict[str, str] = ADMIN) -> dict[str, dict[str, Any]]:
    return {p["username"]: p for p in appliance.http.get("/admin/api/users", headers=headers).json()}


def _refused(response: Any) -> None:
    assert response.status_code == 409, response.text
    error = assert_openai_error(response, 409, "last_admin", "user_id")
    assert "last active admin" in error["message"]
    assert response.headers["x-should-retry"] == "false"


def test_the_api_keeps_one_active_admin(tmp_path: Path) -> None:
    with serve(tmp_path) as appliance:
        first = _people(appliance)["admin"]["id"]
        users = f"/admin/api/users/{first}"
        _refused(appliance.http.patch(users, json={"suspended": True}, headers=ADMIN))
        for role in ("user", "pending"):
            _refused(appliance.http.patch(users, json={"role": role}, headers=ADMIN))
        _refused(appliance.http.delete(users, headers=ADMIN))
        kept = _people(appliance)["admin"]
        assert kept["role"] == "admin" and not kept["suspended"]
        assert appliance.http.patch(users, json={"role": "admin"}, headers=ADMIN).status_code == 200  # no change

        second = appliance.new_person("deputy", role="admin")
        suspended = appliance.http.patch(f"/admin/api/users/{second}", json={"suspended": True}, headers=ADMIN)
        assert suspended.status_code == 200  # the first is still active
        _refused(appliance.http.patch(users, json={"suspended": True}, headers=ADMIN))  # a suspended one is no admin
        appliance.http.patch(f"/admin/api/users/{second}", json={"suspended": False}, headers=ADMIN)
        demoted = appliance.http.patch(users, json={"role": "user"}, headers=ADMIN)
        assert demoted.status_code == 200 and demoted.json()["role"] == "user"
        deputy = {"Authorization": "Basic " + _basic("deputy", "a person's long password")}
        _refused(appliance.http.delete(f"/admin/api/users/{second}", headers=deputy))
        _refused(appliance.http.patch(f"/admin/api/users/{second}", json={"role": "user"}, headers=deputy))
        assert appliance.http.delete(users, headers=deputy).status_code == 204
        assert set(_people(appliance, deputy)) == {"deputy"}
        assert appliance.http.get("/admin/api/users", headers=ADMIN).status_code == 401  # the deleted admin
        missing = appliance.http.delete(users, headers=deputy)
        assert_openai_error(missing, 404, "not_found", "user_id")


def test_a_deleted_person_takes_their_keys_and_sessions_and_leaves_their_history(tmp_path: Path) -> None:
    with serve(tmp_path) as appliance:
        gone = appliance.new_person("leaving")
        session = appliance.person_signs_in("leaving")
        page = appliance.post_form(session, "/account/keys", {"name": "k", CSRF_FIELD: session.csrf})
        key = page.text.split('<code class="new-key">', 1)[1].split("<", 1)[0]
        appliance.http.cookies.clear()
        by_key = {"Authorization": f"Bearer {key}"}
        assert appliance.http.post("/v1/chat/completions", json=CHAT, headers=by_key).status_code == 200
        appliance.flush_history()
        assert appliance.http.delete(f"/admin/api/users/{gone}", headers=ADMIN).status_code == 204
        assert appliance.http.post("/v1/chat/completions", json=CHAT, headers=by_key).status_code == 401
        assert appliance.page(session, "/account").status_code == 303  # signed out: to /login
        with sqlite3.connect(appliance.db_path) as db:
            assert db.execute("SELECT count(*) FROM requests WHERE user_id IS NULL").fetchone() == (1,)
            for table in ("web_sessions", "user_usage", "api_keys"):
                left = db.execute(f"SELECT count(*) FROM {table} WHERE user_id = ?", (gone,)).fetchone()
                assert left == (0,), table


def test_the_console_says_why_the_last_admin_stays(tmp_path: Path) -> None:
    with serve(tmp_path) as appliance:
        first = _people(appliance)["admin"]["id"]
        admin = appliance.sign_in(ADMIN_PASSWORD)
        path = f"/admin/people/{first}/suspend"
        htmx = appliance.post_form(admin, path, {"suspended": "1"}, **{CSRF_HEADER: admin.csrf, "HX-Request": "true"})
        assert htmx.status_code == 422 and htmx.text.lstrip().startswith(f'<article id="person-{first}"')
        assert "last active admin" in htmx.text and "Suspend" in htmx.text
        plain = appliance.post_form(admin, path, {"suspended": "1", CSRF_FIELD: admin.csrf})
        assert plain.status_code == 422 and plain.text.count("last active admin") == 1
        demote = appliance.post_form(
            admin, f"/admin/people/{first}/role", {"role": "pending"}, **{CSRF_HEADER: admin.csrf, "HX-Request": "true"}
        )
        assert demote.status_code == 422 and "last active admin" in demote.text
        assert _people(appliance)["admin"]["role"] == "admin" and not _people(appliance)["admin"]["suspended"]


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()
