"""A person's conversations on the server (/api/conversations): create, read, list newest first and search, change
settings, replace the messages after a turn (kept rows keep their time), delete one and all; the size limits (413);
bad input (400, never retried); the session is required (401, never a redirect) and its CSRF header on every
change."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from tests.web.conftest import InLoop, assert_openai_error
from web.models import ConversationMessage
from web.people.conversations import MAX_CHARS, MAX_MESSAGES
from web.people.guard import CSRF_HEADER, SESSION_COOKIE

API = "/api/conversations"
TURN = [{"role": "user", "content": "What is a KV cache?"}, {"role": "assistant", "content": "Memory for keys."}]


@dataclass
class Person:
    """A signed-in person's requests: the session cookie on each, the CSRF header unless told otherwise."""

    http: httpx.AsyncClient
    cookie: str
    csrf: str

    async def call(self, method: str, path: str, csrf: bool = True, **kwargs: Any) -> httpx.Response:
        headers = {"Cookie": f"{SESSION_COOKIE}={self.cookie}", **({CSRF_HEADER: self.csrf} if csrf else {})}
        return await self.http.request(method, path, headers=headers, **kwargs)

    async def create(self, **body: Any) -> dict[str, Any]:
        response = await self.call("POST", API, json=body)
        assert response.status_code == 201, response.text
        return dict(response.json())


async def person(in_loop: InLoop, name: str, role: str = "user") -> Person:
    """A person (a stand-in hash: nobody signs in with a password here) and a live session of theirs."""
    made = await in_loop.gateway.accounts.insert(name, "scrypt$stand-in", role, None)
    session = await in_loop.gateway.web_sessions.create(made.id)
    return Person(in_loop.http, session.token, session.csrf_token)


@pytest.fixture
async def erin(in_loop: InLoop) -> Person:
    return await person(in_loop, "erin")


async def stored_messages(in_loop: InLoop) -> list[tuple[int, str]]:
    """Every message row in the database (SQLite or PostgreSQL), in order."""
    query = select(ConversationMessage.position, ConversationMessage.content).order_by(ConversationMessage.position)
    async with in_loop.gateway.sessions() as session:
        return [(position, content) for position, content in (await session.execute(query)).all()]


async def test_create_read_update_replace_and_delete(in_loop: InLoop, erin: Person) -> None:
    created = await erin.create(title="Caches", system="Be brief.", temperature=0.2, max_tokens=300, messages=TURN)
    assert len(created["id"]) >= 22 and created["message_count"] == 2
    assert (created["title"], created["system"], created["temperature"], created["max_tokens"]) == (
        "Caches",
        "Be brief.",
        0.2,
        300,
    )
    one = (await erin.call("GET", f"{API}/{created['id']}")).json()
    assert [(m["role"], m["content"]) for m in one["messages"]] == [(m["role"], m["content"]) for m in TURN]

    changed = await erin.call("PATCH", f"{API}/{created['id']}", json={"title": "KV caches", "max_tokens": None})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["title"], changed.json()["max_tokens"], changed.json()["system"]) == (
        "KV caches",
        None,
        "Be brief.",
    )

    first_time = one["messages"][0]["created_at"]
    more = [*TURN, {"role": "user", "content": "And paging?"}, {"role": "assistant", "content": "Blocks."}]
    replaced = await erin.call("PUT", f"{API}/{created['id']}/messages", json={"messages": more})
    assert replaced.status_code == 200, replaced.text
    assert replaced.json()["message_count"] == 4
    again = (await erin.call("GET", f"{API}/{created['id']}")).json()
    assert [m["content"] for m in again["messages"]] == [m["content"] for m in more]
    assert again["messages"][0]["created_at"] == first_time, "a message the page sent again keeps its row"

    edited = [TURN[0], {"role": "assistant", "content": "Regenerated."}]
    await erin.call("PUT", f"{API}/{created['id']}/messages", json={"messages": edited})
    assert await stored_messages(in_loop) == [(0, TURN[0]["content"]), (1, "Regenerated.")]

    assert (await erin.call("DELETE", f"{API}/{created['id']}")).status_code == 204
    assert_openai_error(await erin.call("GET", f"{API}/{created['id']}"), 404, "not_found")
    assert await stored_messages(in_loop) == [], "its messages went with it"


async def test_a_new_conversation_takes_the_defaults(erin: Person) -> None:
    created = await erin.create()
    assert (created["title"], created["system"], created["temperature"], created["max_tokens"]) == (
        "New chat",
        "",
        0.7,
        None,
    )
    assert created["messages"] == []


async def test_the_list_is_newest_first_searchable_and_paged(erin: Person) -> None:
    old = await erin.create(title="Gardening", messages=[{"role": "user", "content": "When to plant TOMATOES?"}])
    mid = await erin.create(title="Rust lifetimes")
    new = await erin.create(title="50% off_sale", messages=[{"role": "assistant", "content": "tomato soup"}])
    listed = (await erin.call("GET", API)).json()
    assert [c["id"] for c in listed["data"]] == [new["id"], mid["id"], old["id"]] and not listed["has_more"]
    assert "messages" not in listed["data"][0] and listed["data"][2]["message_count"] == 1

    async def found(q: str) -> list[str]:
        response = await erin.call("GET", API, params={"q": q})
        assert response.status_code == 200, response.text
        return [c["id"] for c in response.json()["data"]]

    assert await found("tomato") == [new["id"], old["id"]], "message text, any case"
    assert await found("LIFETIME") == [mid["id"]], "titles, any case"
    assert await found("%") == [new["id"]] and await found("_") == [new["id"]], "wildcards are literal"
    assert await found("nothing like it") == []

    await erin.call("PUT", f"{API}/{old['id']}/messages", json={"messages": TURN})
    page = (await erin.call("GET", API, params={"limit": 2})).json()
    assert [c["id"] for c in page["data"]] == [old["id"], new["id"]] and page["has_more"], "a change moves it up"
    rest = (await erin.call("GET", API, params={"limit": 2, "offset": 2})).json()
    assert [c["id"] for c in rest["data"]] == [mid["id"]] and not rest["has_more"]


async def test_delete_all_of_mine(erin: Person) -> None:
    for title in ("a", "b", "c"):
        await erin.create(title=title)
    response = await erin.call("DELETE", API)
    assert response.status_code == 200 and response.json() == {"deleted": 3}
    assert (await erin.call("GET", API)).json()["data"] == []


async def test_a_conversation_beyond_the_limits_is_refused_whole(erin: Person) -> None:
    created = await erin.create(messages=TURN)
    many = [{"role": "user", "content": "x"}] * (MAX_MESSAGES + 1)
    error = assert_openai_error(await erin.call("PUT", f"{API}/{created['id']}/messages", json={"messages": many}), 413)
    assert str(MAX_MESSAGES) in error["message"] and error["param"] == "messages"
    half = MAX_CHARS // 2 + 1
    long = [{"role": "user", "content": "y" * half}, {"role": "assistant", "content": "z" * half}]
    refused = await erin.call("PUT", f"{API}/{created['id']}/messages", json={"messages": long})
    assert str(MAX_CHARS) in assert_openai_error(refused, 413)["message"]
    assert refused.headers["x-should-retry"] == "false"
    assert_openai_error(await erin.call("POST", API, json={"messages": long}), 413)
    kept = (await erin.call("GET", f"{API}/{created['id']}")).json()
    assert [m["content"] for m in kept["messages"]] == [m["content"] for m in TURN], "nothing of it was stored"
    assert len((await erin.call("GET", API)).json()["data"]) == 1, "no conversation was made"


@pytest.mark.parametrize(
    ("method", "suffix", "body", "param"),
    [
        ("POST", "", {"title": ""}, "title"),
        ("POST", "", {"title": "   "}, "title"),
        ("POST", "", {"title": "t" * 201}, "title"),
        ("POST", "", {"title": 7}, "title"),
        ("POST", "", {"temperature": 2.5}, "temperature"),
        ("POST", "", {"temperature": "hot"}, "temperature"),
        ("POST", "", {"max_tokens": 0}, "max_tokens"),
        ("POST", "", {"max_tokens": 1.5}, "max_tokens"),
        ("POST", "", {"owner": 2}, "owner"),
        ("POST", "", {"user_id": 2}, "user_id"),
        ("POST", "", {"messages": [{"role": "system", "content": "x"}]}, None),
        ("POST", "", {"messages": [{"role": "user"}]}, None),
        ("POST", "", {"messages": "hi"}, "messages"),
        ("PATCH", "/{id}", {"title": None}, "title"),
        ("PATCH", "/{id}", {"id": "another"}, "id"),
        ("PATCH", "/{id}", {"created_at": "2020-01-01T00:00:00Z"}, "created_at"),
        ("PUT", "/{id}/messages", {}, None),
        ("PUT", "/{id}/messages", {"messages": [{"role": "user", "content": "x", "extra": 1}]}, None),
        ("PUT", "/{id}/messages", [TURN], None),
    ],
)
async def test_bad_input_is_a_clear_400_never_retried(
    erin: Person, method: str, suffix: str, body: Any, param: str | None
) -> None:
    created = await erin.create(title="untouched", messages=TURN)
    response = await erin.call(method, API + suffix.replace("{id}", created["id"]), json=body)
    error = assert_openai_error(response, 400)
    assert response.headers["x-should-retry"] == "false"
    if param is not None:
        assert param in error["message"] or error["param"] == param, error
    after = (await erin.call("GET", f"{API}/{created['id']}")).json()
    assert (after["title"], after["message_count"]) == ("untouched", 2)
    assert len((await erin.call("GET", API)).json()["data"]) == 1


async def test_bad_query_parameters_are_400(erin: Person) -> None:
    for params in ({"limit": "0"}, {"limit": "201"}, {"limit": "ten"}, {"offset": "-1"}, {"q": "q" * 201}):
        response = await erin.call("GET", API, params=params)
        assert_openai_error(response, 400)
        assert response.headers["x-should-retry"] == "false", params


async def test_without_a_session_every_route_is_401_in_the_api_shape(in_loop: InLoop, erin: Person) -> None:
    created = await erin.create(messages=TURN)
    one = f"{API}/{created['id']}"
    calls = [("GET", API), ("POST", API), ("DELETE", API), ("GET", one), ("PATCH", one), ("DELETE", one)]
    calls.append(("PUT", f"{one}/messages"))
    for method, path in calls:
        for cookie in ({}, {"Cookie": f"{SESSION_COOKIE}=forged"}):
            response = await in_loop.http.request(method, path, headers={**cookie, CSRF_HEADER: erin.csrf}, json={})
            assert_openai_error(response, 401, "session_expired")
            assert response.headers["x-should-retry"] == "false"
    assert (await erin.call("GET", one)).json()["message_count"] == 2


async def test_every_change_needs_the_sessions_csrf_header(in_loop: InLoop, erin: Person) -> None:
    created = await erin.create(title="kept", messages=TURN)
    other = await person(in_loop, "frank")
    one = f"{API}/{created['id']}"
    changes: list[tuple[str, str, Any]] = [
        ("POST", API, {"title": "forged"}),
        ("PATCH", one, {"title": "forged"}),
        ("PUT", f"{one}/messages", {"messages": []}),
        ("DELETE", one, None),
        ("DELETE", API, None),
    ]
    for method, path, body in changes:
        assert_openai_error(await erin.call(method, path, csrf=False, json=body), 401, "csrf_token_invalid")
        cookie = {"Cookie": f"{SESSION_COOKIE}={erin.cookie}"}
        for token in (other.csrf, erin.csrf[:-1], erin.cookie):
            forged = await in_loop.http.request(method, path, headers={**cookie, CSRF_HEADER: token}, json=body)
            assert_openai_error(forged, 401, "csrf_token_invalid")
        form = await in_loop.http.request(method, path, headers=cookie, data={"csrf_token": erin.csrf})
        assert_openai_error(form, 401, "csrf_token_invalid")  # a form (what another site can post) is no header
    assert (await erin.call("GET", API, csrf=False)).status_code == 200, "reading needs no token"
    after = (await erin.call("GET", one)).json()
    assert (after["title"], after["message_count"]) == ("kept", 2)


async def test_a_suspended_or_pending_person_keeps_nothing(in_loop: InLoop, erin: Person) -> None:
    pending = await person(in_loop, "paula", role="pending")
    assert_openai_error(await pending.call("POST", API, json={}), 401, "session_expired")
    accounts = in_loop.gateway.accounts
    found = await accounts.by_name("erin")
    assert found is not None
    await accounts.set_suspended(found.id, True)
    assert_openai_error(await erin.call("GET", API), 401, "session_expired")


async def test_saves_from_two_browsers_at_once_take_turns(erin: Person) -> None:
    """The last save wins whole: never a mix of two lists, never a refusal for having met another save."""
    created = await erin.create(messages=TURN)
    lists = [[*TURN, {"role": "user", "content": f"from browser {i}"}] for i in range(6)]
    saves = [erin.call("PUT", f"{API}/{created['id']}/messages", json={"messages": m}) for m in lists]
    answers = await asyncio.gather(*saves)
    assert [a.status_code for a in answers] == [200] * len(lists), [a.text for a in answers]
    final = (await erin.call("GET", f"{API}/{created['id']}")).json()["messages"]
    assert [{"role": m["role"], "content": m["content"]} for m in final] in lists
