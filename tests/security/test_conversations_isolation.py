"""One person never reaches another's conversations: B, signed in, cannot list, read, rename, append to or delete
A's, whether B knows A's ids or guesses them; A's ids answer B exactly as ids that do not exist; B's delete-all
deletes B's alone; ids are random, not counted. The admin purges a person's conversations, and a person deleted
from the database takes theirs along."""

from __future__ import annotations

import secrets
import sqlite3
from typing import Any

from tests.security.conftest import Appliance, Session
from tests.web.conftest import ADMIN
from web.people.guard import CSRF_HEADER, SESSION_COOKIE

API = "/api/conversations"
SECRET = "A's secret: the launch code is 0000"


def call(appliance: Appliance, session: Session, method: str, path: str, **kwargs: Any) -> Any:
    appliance.http.cookies.clear()
    headers = {"Cookie": f"{SESSION_COOKIE}={session.cookie}", CSRF_HEADER: session.csrf}
    return appliance.http.request(method, path, headers=headers, **kwargs)


def new_conversation(appliance: Appliance, session: Session, title: str) -> str:
    body = {"title": title, "messages": [{"role": "user", "content": SECRET}]}
    created = call(appliance, session, "POST", API, json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def pair(appliance: Appliance, tag: str) -> tuple[Session, Session]:
    appliance.new_person(f"a-{tag}")
    appliance.new_person(f"b-{tag}")
    return appliance.person_signs_in(f"a-{tag}"), appliance.person_signs_in(f"b-{tag}")


def test_b_cannot_reach_a_s_conversations_by_their_ids(appliance: Appliance) -> None:
    a, b = pair(appliance, "ids")
    ids = [new_conversation(appliance, a, f"A's plans {i}") for i in range(3)]
    assert len(set(ids)) == 3 and all(len(i) >= 22 for i in ids)
    assert not any(i.isdigit() for i in ids), "ids are random strings, not a counter"
    missing = secrets.token_urlsafe(18)

    def answers(conversation_id: str) -> list[tuple[int, Any]]:
        one = f"{API}/{conversation_id}"
        seen = [
            call(appliance, b, "GET", one),
            call(appliance, b, "PATCH", one, json={"title": "B was here"}),
            call(appliance, b, "PUT", f"{one}/messages", json={"messages": [{"role": "user", "content": "B"}]}),
            call(appliance, b, "DELETE", one),
        ]
        return [(r.status_code, r.json() if r.content else None) for r in seen]

    unknown = answers(missing)
    assert {status for status, _ in unknown} == {404}
    for conversation_id in ids:
        assert answers(conversation_id) == unknown, "A's conversation answers B as one that does not exist"
    listed = call(appliance, b, "GET", API, params={"q": "secret"}).json()
    assert listed == {"data": [], "has_more": False}
    assert call(appliance, b, "GET", API).json()["data"] == []

    for conversation_id in ids:
        mine = call(appliance, a, "GET", f"{API}/{conversation_id}").json()
        assert mine["title"].startswith("A's plans") and [m["content"] for m in mine["messages"]] == [SECRET]
    assert len(call(appliance, a, "GET", API).json()["data"]) == 3


def test_guessed_ids_find_nothing(appliance: Appliance) -> None:
    a, b = pair(appliance, "guess")
    real = new_conversation(appliance, a, "A's")
    guesses = ["1", "0", "-1", real[:-1], real.upper() if real.upper() != real else real.lower(), real + "x"]
    guesses += ["%", "*", "..", real + "%00", "x" * 64, "' OR '1'='1"]
    for guess in guesses:
        response = call(appliance, b, "GET", f"{API}/{guess}")
        assert response.status_code in (400, 404), (guess, response.text)
        assert SECRET not in response.text
    assert call(appliance, a, "GET", f"{API}/{real}").status_code == 200


def test_delete_all_deletes_mine_alone(appliance: Appliance) -> None:
    a, b = pair(appliance, "all")
    kept = [new_conversation(appliance, a, f"A's {i}") for i in range(2)]
    new_conversation(appliance, b, "B's")
    deleted = call(appliance, b, "DELETE", API)
    assert deleted.status_code == 200 and deleted.json() == {"deleted": 1}
    assert sorted(c["id"] for c in call(appliance, a, "GET", API).json()["data"]) == sorted(kept)


def test_the_admin_purges_a_person_s_conversations_and_nobody_else_can(appliance: Appliance) -> None:
    a, b = pair(appliance, "purge")
    a_id = appliance.http.get("/admin/api/users", headers=ADMIN).json()
    a_id = next(p["id"] for p in a_id if p["username"] == "a-purge")
    new_conversation(appliance, a, "A's one")
    new_conversation(appliance, a, "A's two")
    new_conversation(appliance, b, "B's")
    path = f"/admin/api/users/{a_id}/conversations"
    appliance.http.cookies.clear()
    assert appliance.http.delete(path).status_code == 401
    assert call(appliance, b, "DELETE", path).status_code == 401, "a person's session is not the admin's credential"
    assert len(call(appliance, a, "GET", API).json()["data"]) == 2
    purged = appliance.http.delete(path, headers=ADMIN)
    assert purged.status_code == 200 and purged.json() == {"deleted": 2}
    assert call(appliance, a, "GET", API).json()["data"] == []
    assert len(call(appliance, b, "GET", API).json()["data"]) == 1
    assert appliance.http.delete("/admin/api/users/999999/conversations", headers=ADMIN).status_code == 404


def test_a_deleted_person_takes_their_conversations_along(appliance: Appliance) -> None:
    """No route deletes a person yet; the foreign keys make sure that whatever does, nothing of theirs stays."""
    a, b = pair(appliance, "gone")
    gone = new_conversation(appliance, a, "A's")
    new_conversation(appliance, b, "B's")
    with sqlite3.connect(appliance.db_path) as db:
        db.execute("PRAGMA foreign_keys=ON")
        db.execute("DELETE FROM users WHERE username = 'a-gone'")
        assert db.execute("SELECT COUNT(*) FROM conversations WHERE id = ?", (gone,)).fetchone() == (0,)
        messages = db.execute("SELECT COUNT(*) FROM conversation_messages WHERE conversation_id = ?", (gone,))
        assert messages.fetchone() == (0,)
    assert len(call(appliance, b, "GET", API).json()["data"]) == 1
