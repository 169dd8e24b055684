"""The Litestar app factory: wires the rooms' routers, the one error mapping, and the start-up/shutdown order
(migrate -> recover -> engine in the background -> jobs; drain -> jobs -> engine -> writer -> database)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from litestar.datastructures import State

from engine import EngineError
from web.config import WebConfig
from web.console.mount import pages
from web.db import create_db_engine, create_sessionmaker, upgrade_schema
from web.errors import EXCEPTION_HANDLERS
from web.generation.admission import drain
from web.history.routes import history_router
from web.history.service import HistoryService
from web.history.writer import BatchWriter
from web.jobs import Jobs
from web.keys.limiter import ConcurrencyLimiter
from web.keys.routes import keys_router
from web.keys.service import KeyService
from web.openai.routes import openai_router
from web.state import EngineClient, Services
from web.system.admin_auth import AdminAuth
from web.system.metrics import Metrics
from web.system.openapi import document_router
from web.system.routes import admin_system_router, system_router

log = logging.getLogger("web.app")


def build_services(config: WebConfig, client: EngineClient) -> Services:
    db = create_db_engine(config.database_url)
    sessions = create_sessionmaker(db)
    holder: list[Services] = []
    metrics = Metrics(client.stats, lambda: holder[0].model_name if holder else None)
    writer = BatchWriter(db, on_error=metrics.observe_db_error)
    services = Services(
        config=config,
        client=client,
        db=db,
        sessions=sessions,
        writer=writer,
        keys=KeyService(sessions, db),
        history=HistoryService(sessions, writer),
        limiter=ConcurrencyLimiter(),
        metrics=metrics,
        admin=AdminAuth(sessions, config.metrics_token),
        started_at=int(time.time()),
    )
    holder.append(services)
    return services


async def start_services(services: Services) -> None:
    """Database first (schema, crash recovery, admin seed), then the engine without waiting for it."""
    if services.config.run_migrations:
        await upgrade_schema(services.db)
    interrupted = await services.history.mark_interrupted()
    if interrupted:
        log.warning("marked %d request(s) left in flight by the last run as interrupted", interrupted)
    await services.keys.release_all_reservations()
    if await services.admin.seed(services.config.admin_password):
        log.info("admin credential stored from the admin_password setting")
    services.writer.start()


async def _start_engine(services: Services) -> None:
    try:
        info = await services.client.start()
        log.info("engine ready: %s (max_model_len %d)", info.name, info.max_model_len)
    except EngineError as exc:
        services.engine_start_error = str(exc)
        log.error("the engine failed to start: %s", exc)


async def stop_services(services: Services, engine_task: asyncio.Task[None] | None = None) -> None:
    await drain(services, services.config.drain_timeout)
    if engine_task is not None and not engine_task.done():
        engine_task.cancel()
    await services.client.shutdown()
    await services.writer.stop()
    await services.db.dispose()


def create_app(config: WebConfig, client: EngineClient) -> Litestar:
    services = build_services(config, client)

    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await start_services(services)
        engine_task = asyncio.create_task(_start_engine(services), name="engine-start")
        jobs = Jobs(services)
        jobs.start()
        try:
            yield
        finally:
            jobs.shutdown()
            await stop_services(services, engine_task)

    api = [openai_router, system_router, admin_system_router, keys_router, history_router]
    browser = pages()  # the chat page, the admin console, their templates and static files
    return Litestar(
        route_handlers=[*api, document_router(api), *browser.route_handlers],
        template_config=browser.template_config,
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan],
        state=State({"services": services}),
        request_max_body_size=config.max_body_bytes,
        openapi_config=None,  # the document is web/system/openapi.py's: Litestar's alone is wrong (and at /schema)
        logging_config=None,  # logging belongs to the process (appliance), not to the web room
    )
