"""System room and jobs: health and readiness, Prometheus metrics behind auth, the admin stats snapshot, the
engine sampler and retention."""

import asyncio
import sqlite3
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.web.conftest import (
    ADMIN,
    ADMIN_PASSWORD,
    METRICS_TOKEN,
    MODEL,
    InLoop,
    assert_openai_error,
    bearer,
    new_key,
    rows,
)
from web.errors import AdminAuthRequired
from web.jobs import Jobs, Sampler
from web.models import utcnow

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}


def samples(text: str) -> dict[str, list[Any]]:
    found: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append(sample)
    return found


async def test_health_and_ready(client: Any) -> None:
    assert (await client.get("/health")).json() == {"status": "ok"}
    ready = (await client.get("/ready")).json()
    assert ready == {"status": "ready", "model": MODEL, "kv_cache_tokens": 64 * 16, "kv_cache_dtype": "auto"}


async def test_metrics_need_a_credential(client: Any) -> None:
    assert_openai_error(await client.get("/metrics"), 401)
    assert_openai_error(await client.get("/metrics", headers=bearer("wrong-token")), 401)
    key = await new_key(client)
    assert_openai_error(await client.get("/metrics", headers=bearer(key)), 401)
    assert (await client.get("/metrics", headers=bearer(METRICS_TOKEN))).status_code == 200
    assert (await client.get("/metrics", headers=ADMIN)).status_code == 200


async def test_metrics_content(client: Any) -> None:
    key = await new_key(client, "team", quota_tokens=1000)
    for _ in range(2):
        await client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=bearer(key))
    await client.post("/v1/chat/completions", json={**CHAT, "n": 99}, headers=bearer(key))
    response = await client.get("/metrics", headers=bearer(METRICS_TOKEN))
    assert response.headers["content-type"].startswith("text/plain")
    found = samples(response.text)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "appliance_model_weights_bytes",
        "appliance_kv_pool_bytes",
        "appliance_device_memory_free_bytes",
    ):
        assert name in found, name
    assert found["vllm:kv_cache_usage_perc"][0].value == 0.25
    assert found["vllm:kv_cache_usage_perc"][0].labels == {"model_name": MODEL}
    for histogram in (
        "vllm:request_queue_time_seconds",
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:inter_token_latency_seconds",
    ):
        assert found[histogram + "_count"][0].value >= 2, histogram
    assert found["vllm:inter_token_latency_seconds_count"][0].value == 8  # 4 intervals in each of 2 streams
    success = {s.labels["finished_reason"]: s.value for s in found["vllm:request_success_total"]}
    assert success == {"stop": 2}
    quota = {s.name: s for s in found["appliance_key_quota_used_tokens"]}
    assert found["appliance_key_quota_used_tokens"][0].labels == {"key_id": "1", "key_name": "team"}
    assert found["appliance_key_quota_used_tokens"][0].value == 2 * 24 and quota
    assert found["appliance_key_quota_limit_tokens"][0].value == 1000
    rejected = {s.labels["reason"]: s.value for s in found["appliance_requests_rejected_total"]}
    assert rejected == {"invalid_request_error": 1}


async def test_admin_credential_checks(in_loop: InLoop) -> None:
    admin = in_loop.gateway.admin
    assert await admin.configured()
    for _ in range(2):  # the second from the remembered check
        assert (await admin.sign_in("admin", ADMIN_PASSWORD, "192.0.2.1")).role == "admin"
    with pytest.raises(AdminAuthRequired):
        await admin.sign_in("admin", "wrong-password", "192.0.2.2")
    with pytest.raises(AdminAuthRequired):
        await admin.sign_in("root", ADMIN_PASSWORD, "192.0.2.3")
    await admin.set_password("a-new-password")
    with pytest.raises(AdminAuthRequired):
        await admin.sign_in("admin", ADMIN_PASSWORD, "192.0.2.4")  # the remembered check is forgotten
    assert (await admin.sign_in("admin", "a-new-password", "192.0.2.5")).username == "admin"


async def test_admin_stats_snapshot(client: Any) -> None:
    assert_openai_error(await client.get("/admin/api/stats"), 401)
    stats = (await client.get("/admin/api/stats", headers=ADMIN)).json()
    assert stats["state"] == "ready" and stats["ready"] is True and stats["in_flight"] == 0
    assert stats["model"]["name"] == MODEL and stats["engine"]["kv_blocks_used"] == 16
    assert stats["kv_usage"] == 0.25 and stats["queue_wait_s"]["p95"] == 0.02


def new_sampler(app: InLoop) -> Sampler:
    g = app.gateway
    return Sampler(g.client.stats, g.metrics, g.sessions)


def new_jobs(app: InLoop) -> Jobs:
    g = app.gateway
    return Jobs(g.config, g.keys, g.history, new_sampler(app))


async def test_sampler_stores_engine_samples(in_loop: InLoop, db: sqlite3.Connection) -> None:
    await in_loop.gateway.jobs.stop()  # the gateway's own sampler (each 5 s) would add rows on a slow machine
    sampler = new_sampler(in_loop)
    await sampler.run()
    key = await new_key(in_loop.http)
    for _ in range(3):
        await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    await sampler.run()
    first, second = rows(db, "SELECT * FROM engine_samples ORDER BY id")
    assert (second["running"], second["waiting"], second["kv_usage"]) == (1, 2, 0.25)
    assert second["memory_kind"] == "RAM" and second["memory_free_bytes"] == 1 << 29
    assert first["tokens_per_s"] == 0 and second["tokens_per_s"] > 0  # 15 tokens since the first sample
    assert second["queue_wait_p95_s"] is not None and first["queue_wait_p95_s"] is None
    assert first["preemptions"] == second["preemptions"] == 0  # the fake's counter stays at 3
    listed = await in_loop.http.get("/admin/api/samples?minutes=5", headers=ADMIN)
    assert [s["running"] for s in listed.json()] == [1, 1]


async def test_retention_prunes_old_rows_and_samples(in_loop: InLoop, db: sqlite3.Connection) -> None:
    await in_loop.gateway.jobs.stop()  # only the runs below count (the gateway's sampler would add rows)
    key = await new_key(in_loop.http)
    await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    await new_sampler(in_loop).run()
    old = (datetime.now(UTC) - timedelta(days=40)).replace(tzinfo=None)
    db.execute("UPDATE requests SET arrival_at = ?", (old,))
    db.execute("UPDATE engine_samples SET at = ?", ((datetime.now(UTC) - timedelta(days=8)).replace(tzinfo=None),))
    db.commit()
    await in_loop.http.post("/v1/chat/completions", json=CHAT, headers=bearer(key))
    await new_sampler(in_loop).run()
    await new_jobs(in_loop).prune()
    assert len(rows(db, "SELECT id FROM requests")) == 1
    assert len(rows(db, "SELECT id FROM engine_samples")) == 1


async def test_jobs_start_and_stop_with_the_app(in_loop: InLoop) -> None:
    jobs = new_jobs(in_loop)
    jobs.start()
    assert {job.id for job in jobs.scheduler.get_jobs()} == {"quota-rollover", "retention", "engine-sampler"}
    await jobs.stop()
    await asyncio.sleep(0.01)  # APScheduler applies shutdown on the loop's next turn
    assert not jobs.scheduler.running
    assert utcnow().tzinfo is not None


async def test_stop_waits_for_a_run_in_progress(in_loop: InLoop) -> None:
    jobs = new_jobs(in_loop)
    finished: list[bool] = []

    async def slow() -> None:
        await asyncio.sleep(0.2)
        finished.append(True)

    run = asyncio.ensure_future(jobs._run(slow))
    await asyncio.sleep(0.01)
    await jobs.stop()
    assert finished == [True] and run.done()


async def test_engine_that_fails_to_start_keeps_the_server_up(db_path: Any) -> None:
    from engine import ModelLoadError
    from tests.web.conftest import client_for
    from tests.web.fakes import FakeEngineClient

    class Broken(FakeEngineClient):
        async def start(self) -> Any:
            self.state = "loading"
            raise ModelLoadError("no such model: /models/missing.gguf")

    async with client_for(Broken(), db_path, ready=False) as client:
        for _ in range(50):
            response = await client.get("/ready")
            if "failed to start" in response.text:
                break
            await asyncio.sleep(0.02)
        assert "missing.gguf" in assert_openai_error(response, 503, "not_ready")["message"]
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/admin/api/stats", headers=ADMIN)).json()["ready"] is False
