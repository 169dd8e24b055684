"""The Litestar app factory: builds the gateway's parts once, hands each handler the ones it names through
Litestar's dependencies, wires the rooms' routers with their guards and the one error mapping, and owns the
start-up/shutdown order (migrate -> recover -> engine in the background -> jobs; drain -> jobs -> engine ->
writer -> database)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, fields
from typing import Any

from litestar import Litestar
from litestar.di import Provide
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import AsyncEmbeddingClient
from web.anthropic.errors import on_messages_paths
from web.anthropic.routes import anthropic_router
from web.backends.embedded import EmbeddedBackend
from web.backends.protocol import Backend
from web.backends.publish import publish_router
from web.backends.router import Router, remote_backends
from web.backends.tokenizers import Tokenizers
from web.config import WebConfig
from web.console.backends import backends_api
from web.console.mount import pages
from web.db import create_db_engine, create_sessionmaker, upgrade_schema
from web.embeddings.service import Embedder
from web.errors import EXCEPTION_HANDLERS
from web.generation.backend import EngineClient
from web.generation.gate import EngineGate
from web.generation.inflight import InFlight
from web.generation.prompts import Prompts
from web.generation.run import Generations
from web.history.routes import history_router
from web.history.service import HistoryService
from web.history.stored import ResponseStore
from web.history.writer import BatchWriter
from web.jobs import Jobs, Sampler
from web.keys.front_end import FrontEnds
from web.keys.guard import api_key_guard
from web.keys.limiter import ConcurrencyLimiter
from web.keys.routes import keys_router
from web.keys.service import KeyService
from web.keys.views import KeyViews
from web.ledger import Ledger
from web.ollama.errors import on_ollama_paths
from web.ollama.routes import ollama_router
from web.openai.routes import openai_router
from web.people.accounts import Accounts
from web.people.admin_api import people_api
from web.people.conversations import Conversations
from web.people.conversations_api import conversations_api
from web.people.enrol import Enrolment
from web.people.oidc.routes import oidc_router
from web.people.oidc.service import SingleSignOn
from web.people.personal_keys import PersonalKeys
from web.people.plans import Plans
from web.people.plans_api import plans_api
from web.people.sessions import SessionStore
from web.people.signin import SignIn
from web.responses.routes import responses_router
from web.system.access import AccessLog
from web.system.admin_auth import AdminAuth, admin_guard, metrics_guard
from web.system.metrics import Metrics
from web.system.models import Catalog, ModelSwitch
from web.system.openapi import document_router
from web.system.routes import admin_system_router, system_router

log = logging.getLogger("web.app")


@dataclass(frozen=True, slots=True)
class Gateway:
    """The parts of one app, built once. Handlers never see this: each names the parts it uses (the field names
    are the dependency names); the app factory, the service around it (appliance/) and tests hold it."""

    config: WebConfig
    client: EngineClient  # the local engine
    router: Router  # the local engine and the remote backends, one of which serves each request
    db: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]
    writer: BatchWriter
    keys: KeyService
    views: KeyViews
    history: HistoryService
    limiter: ConcurrencyLimiter
    metrics: Metrics
    admin: AdminAuth
    gate: EngineGate
    ledger: Ledger
    front_ends: FrontEnds
    inflight: InFlight
    generations: Generations
    prompts: Prompts
    jobs: Jobs
    models: ModelSwitch
    responses: ResponseStore
    embedder: Embedder  # the embedding model (none where the operator configured none)
    accounts: Accounts
    plans: Plans
    personal_keys: PersonalKeys
    enrolment: Enrolment
    web_sessions: SessionStore
    conversations: Conversations
    sso: SingleSignOn | None = None  # single sign-on, where a provider is configured

    def dependencies(self) -> dict[str, Provide]:
        return {f.name: _provider(getattr(self, f.name)) for f in fields(self)}

    async def start(self) -> None:
        """Database first (schema, crash recovery, admin seed); the engine is the caller's to start."""
        if self.config.run_migrations:
            await upgrade_schema(self.db)
        interrupted = await self.ledger.recover()
        if interrupted:
            log.warning("marked %d request(s) left in flight by the last run as interrupted", interrupted)
        if await self.admin.seed(self.config.admin_password):
            log.info("admin credential stored from the admin_password setting")
        self.writer.start()

    async def stop(self, engine_task: asyncio.Task[None] | None = None) -> None:
        await self.inflight.drain(self.config.drain_timeout)
        if engine_task is not None and not engine_task.done():
            engine_task.cancel()
        await self.client.shutdown()
        await self.router.aclose()
        await self.writer.stop()
        await self.db.dispose()


def _provider(value: Any) -> Provide:
    def provide() -> Any:
        return value

    return Provide(provide, use_cache=True, sync_to_thread=False)


def build_gateway(
    config: WebConfig,
    client: EngineClient,
    catalog: Catalog | None = None,
    embeddings: AsyncEmbeddingClient | None = None,
) -> Gateway:
    """`catalog`: the local models the console may switch to (appliance/ provides it; none: no switching).
    `embeddings`: the embedding model's client, which its owner starts and stops (none: no embeddings)."""
    db = create_db_engine(config.database_url)
    sessions = create_sessionmaker(db)
    router = build_router(config, client, lambda: gate.model_name)
    gate = EngineGate(client, config.served_model_name, router)
    metrics = Metrics(client.stats, lambda: gate.model_name)
    writer = BatchWriter(db, on_error=metrics.observe_db_error)
    keys = KeyService(sessions, db)
    history = HistoryService(sessions)
    limiter = ConcurrencyLimiter()
    plans = Plans(sessions)
    front_ends = FrontEnds(sessions, plans)
    ledger = Ledger(db, writer, keys, limiter, metrics, config.store_text, config.gateway_id, front_ends)
    inflight = InFlight(gate, ledger)
    accounts = Accounts(sessions)
    return Gateway(
        config=config,
        client=client,
        router=router,
        db=db,
        sessions=sessions,
        writer=writer,
        keys=keys,
        views=KeyViews(keys, limiter),
        history=history,
        limiter=limiter,
        metrics=metrics,
        admin=AdminAuth(accounts, SignIn(sessions), config.metrics_token),
        gate=gate,
        ledger=ledger,
        front_ends=front_ends,
        inflight=inflight,
        generations=Generations(router, ledger, inflight, metrics, config.store_text),
        prompts=Prompts(router, config.default_max_tokens, config.store_text, config.trim_max_tokens),
        jobs=Jobs(config, keys, history, Sampler(client.stats, metrics, sessions)),
        models=ModelSwitch(gate, inflight, catalog, config.drain_timeout),
        responses=ResponseStore(sessions, config.store_text),
        embedder=Embedder(embeddings, ledger),
        accounts=accounts,
        plans=plans,
        personal_keys=PersonalKeys(keys),
        enrolment=Enrolment(accounts, sessions, config.self_signup),
        web_sessions=SessionStore(sessions),
        conversations=Conversations(sessions),
        sso=None if config.oidc is None else SingleSignOn.of(config.oidc, accounts, sessions),
    )


def build_router(config: WebConfig, client: EngineClient, local_name: Callable[[], str | None]) -> Router:
    """The local engine (unless the backends list leaves it out) and the remote backends. `local_name` is the
    gate's model name (a model switch renames it), read when asked."""
    backends: list[Backend] = []
    seats: dict[str, int | None] = {config.local_backend_name: config.local_max_in_flight}
    if config.backends.embedded:
        backends.append(EmbeddedBackend(client, local_name, config.local_backend_name))
    if not config.backends.remotes:
        return Router(backends, seats=seats)
    remotes, http = remote_backends(config.backends.remotes, Tokenizers(client, local_name))
    seats |= {s.name: s.max_in_flight or config.backend_max_in_flight for s in config.backends.remotes}
    return Router(backends + remotes, config.sticky_backends, http, seats=seats)


def create_app(config: WebConfig, client: EngineClient, embeddings: AsyncEmbeddingClient | None = None) -> Litestar:
    return app_of(build_gateway(config, client, embeddings=embeddings))


def app_of(gateway: Gateway) -> Litestar:
    @asynccontextmanager
    async def lifespan(_: Litestar) -> AsyncIterator[None]:
        await gateway.start()
        engine_task = None
        if gateway.router.embedded is not None:
            engine_task = asyncio.create_task(gateway.gate.start_engine(), name="engine-start")
        monitor = (
            asyncio.create_task(gateway.router.monitor(), name="backend-probes") if gateway.router.has_remotes else None
        )
        gateway.jobs.start()
        try:
            yield
        finally:
            await gateway.jobs.stop()
            if monitor is not None:
                monitor.cancel()
            await gateway.stop(engine_task)

    admin = admin_guard(gateway.admin)
    api_key = api_key_guard(gateway.keys, gateway.web_sessions, gateway.config.keyless)
    api = [
        openai_router(api_key),
        anthropic_router(api_key),
        responses_router(api_key),
        ollama_router(api_key),
        publish_router(api_key),
        system_router(metrics_guard(gateway.admin)),
        admin_system_router(admin),
        keys_router(admin),
        people_api(admin),
        plans_api(admin),
        *conversations_api(gateway.web_sessions, admin),
        history_router(admin),
        backends_api(admin),
    ]
    browser = pages(gateway.web_sessions)  # the chat page, the admin console, their templates and static files
    sign_on = [oidc_router()] if gateway.sso is not None else []
    dependencies = gateway.dependencies()
    app = Litestar(
        route_handlers=[*api, document_router(api, admin, dependencies), *browser.route_handlers, *sign_on],
        dependencies=dependencies,
        template_config=browser.template_config,
        exception_handlers=on_ollama_paths(on_messages_paths(EXCEPTION_HANDLERS)),
        lifespan=[lifespan],
        request_max_body_size=gateway.config.max_body_bytes,
        openapi_config=None,  # the document is web/system/openapi.py's: Litestar's alone is wrong (and at /schema)
        logging_config=None,  # logging belongs to the process (appliance), not to the web room
    )
    # Around Litestar's whole handler, routing included: unknown routes and wrong methods are logged and counted.
    app.asgi_handler = AccessLog(app.asgi_handler, gateway.metrics)
    return app
