"""Request history: one row per request with every field, rejections recorded, text only when enabled,
crash recovery at start-up, and the admin history API (filters, pagination, detail)."""

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.web.conftest import (
    ADMIN,
    MODEL,
    assert_openai_error,
    bearer,
    client_for,
    new_key,
    rows,
)
from tests.web.fakes import FakeEngineClient

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_finished_request_row_has_every_field(client: Any, db: sqlite3.Connection) -> None:
    key = await new_key(client, max_tokens_per_request=50)
    body = {**CHAT, "max_tokens": 4, "user": "alice", "stream": True}
    assert (await client.post("/v1/chat/completions", json=body, headers=bearer(key))).status_code == 200
    (row,) = rows(db, "SELECT * FROM requests")
    assert row["id"].startswith("chatcmpl-") and row["key_id"] == 1 and row["model"] == MODEL
    assert (row["endpoint"], row["stream"], row["status"], row["finish_reason"]) == (
        "chat.completions",
        1,
        "finished",
        "length",
    )
    assert (row["prompt_tokens"], row["completion_tokens"]) == (19, 4)
    assert (row["max_tokens_requested"], row["max_tokens_applied"], row["reserved_tokens"]) == (4, 4, 0)
    times = [parse(row[c]) for c in ("arrival_at", "admitted_at", "first_token_at", "finished_at")]
    assert times == sorted(times) and datetime.now() - times[0] < timedelta(minutes=1)
    assert 0 <= row["queue_wait_s"] <= row["ttft_s"] <= row["e2e_s"] and row["tpot_s"] >= 0
    assert (row["client_addr"], row["user"], row["error"]) == ("testclient", "alice", None)
    assert row["prompt_text"] is None and row["response_text"] is None


async def test_text_is_stored_only_when_enabled(fake: FakeEngineClient, db_path: Path, db: Any) -> None:
    async with client_for(fake, db_path, store_text=True) as client:
        key = await new_key(client)
        await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
        await client.post("/v1/completions", json={"model": MODEL, "prompt": "abc"}, headers=bearer(key))
    chat, text = rows(db, "SELECT prompt_text, response_text FROM requests ORDER BY endpoint")
    assert '"content":"hi"' in chat["prompt_text"] and chat["response_text"] == "t0 t1 t2 t3 t4 "
    assert text["prompt_text"] == "abc" and text["response_text"] == "t0 t1 t2 t3 t4 "


async def test_rejections_after_authentication_are_recorded(
    client: Any, fake: FakeEngineClient, db: sqlite3.Connection
) -> None:
    key = await new_key(client, quota_tokens=30)
    await client.post("/v1/chat/completions", json=CHAT)  # no key: no row
    await client.post("/v1/chat/completions", content=b"{oops", headers=bearer(key))
    # A prompt the quota cannot hold (a smaller max_tokens would not help: issue 17, Q1 lowers it instead).
    long = {**CHAT, "messages": [{"role": "user", "content": "x" * 20}], "max_tokens": 20}
    await client.post("/v1/chat/completions", json=long, headers=bearer(key))  # quota
    fake.reject_next = "queue_full"
    await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2}, headers=bearer(key))
    found = rows(db, "SELECT status, error, reserved_tokens FROM requests ORDER BY arrival_at")
    assert [r["status"] for r in found] == ["rejected"] * 3
    assert "not valid JSON" in found[0]["error"] and "insufficient quota" in found[1]["error"]
    assert "overloaded" in found[2]["error"]
    assert all(r["reserved_tokens"] == 0 for r in found)
    (quota,) = rows(db, "SELECT used_tokens, reserved_tokens FROM key_usage")
    assert (quota["used_tokens"], quota["reserved_tokens"]) == (0, 0)  # a refused request costs nothing


async def test_start_up_marks_rows_left_in_flight_interrupted(
    fake: FakeEngineClient, db_path: Path, db: sqlite3.Connection
) -> None:
    async with client_for(fake, db_path) as client:
        await new_key(client)
    now = datetime.now(UTC).replace(tzinfo=None)
    for rid, status in (("r-queued", "queued"), ("r-running", "running"), ("r-done", "finished")):
        db.execute(
            "INSERT INTO requests (id, key_id, model, endpoint, stream, status, prompt_tokens, completion_tokens,"
            " cached_tokens, reserved_tokens, arrival_at) VALUES (?, 1, 'm', 'completions', 0, ?, 3, 0, 0, 9, ?)",
            (rid, status, now),
        )
    db.execute("UPDATE key_usage SET reserved_tokens = 18")
    db.commit()
    async with client_for(FakeEngineClient(), db_path):
        pass
    found = {r["id"]: r for r in rows(db, "SELECT * FROM requests")}
    assert found["r-queued"]["status"] == found["r-running"]["status"] == "interrupted"
    assert found["r-running"]["finished_at"] is not None and found["r-running"]["reserved_tokens"] == 0
    assert found["r-done"]["status"] == "finished"
    assert rows(db, "SELECT reserved_tokens FROM key_usage")[0]["reserved_tokens"] == 0


async def test_admin_history_filters_and_pages(client: Any) -> None:
    first, second = await new_key(client, "a"), await new_key(client, "b")
    for key in (first, first, first, second):
        await client.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    await client.post("/v1/chat/completions", json={**CHAT, "n": 99}, headers=bearer(second))
    page = (await client.get("/admin/api/requests?limit=2", headers=ADMIN)).json()
    assert page["total"] == 5 and len(page["data"]) == 2 and page["limit"] == 2
    arrivals = [parse(r["arrival_at"]) for r in page["data"]]
    assert arrivals == sorted(arrivals, reverse=True)  # newest first
    rest = (await client.get("/admin/api/requests?limit=2&offset=4", headers=ADMIN)).json()
    assert len(rest["data"]) == 1
    by_key = (await client.get("/admin/api/requests?key_id=1", headers=ADMIN)).json()
    assert by_key["total"] == 3 and {r["key_id"] for r in by_key["data"]} == {1}
    rejected = (await client.get("/admin/api/requests?status=rejected", headers=ADMIN)).json()
    assert rejected["total"] == 1 and rejected["data"][0]["key_id"] == 2
    future = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert (await client.get(f"/admin/api/requests?since={future}", headers=ADMIN)).json()["total"] == 0
    assert (await client.get(f"/admin/api/requests?until={future}", headers=ADMIN)).json()["total"] == 5
    detail = await client.get(f"/admin/api/requests/{page['data'][0]['id']}", headers=ADMIN)
    assert detail.status_code == 200 and detail.json()["id"] == page["data"][0]["id"]


async def test_admin_history_bad_queries(client: Any) -> None:
    assert_openai_error(await client.get("/admin/api/requests/nope", headers=ADMIN), 404)
    assert_openai_error(await client.get("/admin/api/requests?status=lost", headers=ADMIN), 400, param="status")
    assert_openai_error(await client.get("/admin/api/requests?limit=0", headers=ADMIN), 400, param="limit")
    assert_openai_error(await client.get("/admin/api/requests?key_id=x", headers=ADMIN), 400, param="key_id")
    naive = await client.get("/admin/api/requests?since=2026-01-01T00:00:00", headers=ADMIN)
    assert_openai_error(naive, 400, param="since")
    assert_openai_error(await client.get("/admin/api/requests"), 401)
