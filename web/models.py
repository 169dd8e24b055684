"""The SQLite tables: API keys and their quota state, the request history, stored Responses API answers, engine
samples, people (users, their plans, sessions, invites and conversations)."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out; SQLite itself keeps naive ISO text."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are not stored; pass an aware UTC datetime")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


# Counts of tokens and bytes outgrow 32 bits (a quota of billions of tokens, 24 GiB of RAM): BIGINT on PostgreSQL.
# SQLite's INTEGER already holds 64 bits, and stays INTEGER as its migrations wrote it.
BigCount = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    # Named constraints: Alembic's SQLite batch mode can only drop or alter what has a name.
    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


class ApiKey(Base):
    """A key is shown once; only its sha256 and a short visible prefix are kept."""

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(BigCount, primary_key=True)  # ids come in from URLs too
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    max_tokens_per_request: Mapped[int | None] = mapped_column(BigCount)
    quota_tokens: Mapped[int | None] = mapped_column(BigCount)
    quota_period: Mapped[str] = mapped_column(String(8))  # day | week | month | none
    max_concurrent: Mapped[int | None] = mapped_column(BigCount)
    # Fair share: the key's weight against other busy keys, and its class (interactive goes before batch).
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    priority: Mapped[str] = mapped_column(String(16), default="interactive", server_default="interactive")
    # A personal key: its owner's plan sets its limits and its requests count against the owner's quota.
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    # A trusted front end (Open WebUI and the like): each request may name its end user, who then runs as a
    # tenant of their own (web/keys/front_end.py); with front_end_accounts, a name that is a person's account
    # runs as that person. front_end_plan_id: the end users' plan (none: the key's own limits, per end user).
    front_end: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    front_end_accounts: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    front_end_plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"))


class KeyUsage(Base):
    """Quota state of one key in its current period; reserved covers requests in flight."""

    __tablename__ = "key_usage"

    key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    used_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    reserved_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_requests: Mapped[int] = mapped_column(BigCount, default=0)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class RequestRecord(Base):
    """One row per request that passed authentication; it always reaches a terminal status."""

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_arrival_at", "arrival_at"),
        Index("ix_requests_key_id_arrival_at", "key_id", "arrival_at"),
        Index("ix_requests_status", "status"),
        Index("ix_requests_backend_arrival_at", "backend", "arrival_at"),
        Index("ix_requests_user_id_arrival_at", "user_id", "arrival_at"),
        Index("ix_requests_end_user_id_arrival_at", "end_user_id", "arrival_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[int | None] = mapped_column(ForeignKey("api_keys.id", ondelete="SET NULL"))
    # The person it counts against (their session or personal key); their quota was reserved, not the key's.
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    model: Mapped[str] = mapped_column(String(200))
    endpoint: Mapped[str] = mapped_column(String(64))
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(16))
    finish_reason: Mapped[str | None] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    completion_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    max_tokens_requested: Mapped[int | None] = mapped_column(BigCount)
    max_tokens_applied: Mapped[int | None] = mapped_column(BigCount)
    reserved_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    arrival_at: Mapped[datetime] = mapped_column(UTCDateTime())
    admitted_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    first_token_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    queue_wait_s: Mapped[float | None] = mapped_column(Float)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    client_addr: Mapped[str | None] = mapped_column(String(64))
    # Which gateway admitted it, where several share one database: only that one may call it interrupted.
    gateway: Mapped[str | None] = mapped_column(String(128))
    # Which backend served it: "embedded", or a remote server's host:port (web/backends/status.py names them).
    backend: Mapped[str | None] = mapped_column(String(100))
    user: Mapped[str | None] = mapped_column(String(256))
    # The end user a front-end key named (whose quota it counts against).
    end_user_id: Mapped[int | None] = mapped_column(ForeignKey("end_users.id", ondelete="SET NULL"))
    error: Mapped[str | None] = mapped_column(Text)
    prompt_text: Mapped[str | None] = mapped_column(Text)
    response_text: Mapped[str | None] = mapped_column(Text)


class EngineSample(Base):
    """A 5-second snapshot of the engine for the console's charts; pruned after a week."""

    __tablename__ = "engine_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    running: Mapped[int] = mapped_column(Integer)
    waiting: Mapped[int] = mapped_column(Integer)
    kv_usage: Mapped[float] = mapped_column(Float)
    kv_blocks_used: Mapped[int] = mapped_column(BigCount)
    kv_blocks_total: Mapped[int] = mapped_column(BigCount)
    memory_kind: Mapped[str] = mapped_column(String(8))
    memory_total_bytes: Mapped[int] = mapped_column(BigCount)
    memory_free_bytes: Mapped[int] = mapped_column(BigCount)
    weights_bytes: Mapped[int] = mapped_column(BigCount)
    kv_pool_bytes: Mapped[int] = mapped_column(BigCount)
    queue_wait_p95_s: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float] = mapped_column(Float)
    preemptions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")  # in this sample's window


class Plan(Base):
    """A named set of limits people are given (web/people/plans.py); a user's own overrides go over it. models:
    the JSON list of the served model names it may use; empty: every model."""

    __tablename__ = "plans"

    id: Mapped[int] = mapped_column(BigCount, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    max_tokens_per_request: Mapped[int | None] = mapped_column(BigCount)
    quota_tokens: Mapped[int | None] = mapped_column(BigCount)
    quota_period: Mapped[str] = mapped_column(String(8), default="none")
    max_concurrent: Mapped[int | None] = mapped_column(BigCount)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    priority: Mapped[str] = mapped_column(String(16), default="interactive")
    models: Mapped[str] = mapped_column(Text, default="[]")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class User(Base):
    """A person: a role (admin, user, pending: signed up, awaiting approval), a scrypt password hash (never the
    password), a plan and the JSON of their own overrides of it; suspended people cannot sign in."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(BigCount, primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(256))
    role: Mapped[str] = mapped_column(String(16))
    suspended: Mapped[bool] = mapped_column(Boolean, default=False)
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"))
    overrides: Mapped[str] = mapped_column(Text, default="{}")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class UserUsage(Base):
    """Quota state of one person in their plan's current period, over their sessions and personal keys alike."""

    __tablename__ = "user_usage"

    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    used_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    reserved_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_requests: Mapped[int] = mapped_column(BigCount, default=0)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class WebSession(Base):
    """A signed-in browser: only the sha256 of its cookie's random id is kept (a database copy signs nobody in);
    the CSRF token is derived from the id, so it is not stored at all."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    address: Mapped[str | None] = mapped_column(String(64))


class Invite(Base):
    """A one-use sign-up link the admin made: its token's sha256, the role and plan it gives, and its expiry."""

    __tablename__ = "invites"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    used_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


class StoredResponse(Base):
    """A Responses API answer kept for GET /v1/responses/{id} and previous_response_id, only where the operator
    stores text: its body as returned, and the conversation (template messages) it ended, for a continuation. Only
    the key that created it reads it; it goes with its key and with the history's retention."""

    __tablename__ = "stored_responses"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # the history row's id
    key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), index=True)
    body: Mapped[str] = mapped_column(Text)
    conversation: Mapped[str] = mapped_column(Text)


class Conversation(Base):
    """A person's saved chat (the chat page's, signed in): its title, system prompt and sampling settings. The id is
    random (no one counts their way to another's); it goes with its person."""

    __tablename__ = "conversations"
    __table_args__ = (Index("ix_conversations_user_id_updated_at", "user_id", "updated_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    title: Mapped[str] = mapped_column(String(200))
    system: Mapped[str] = mapped_column(Text)
    temperature: Mapped[float] = mapped_column(Float)
    max_tokens: Mapped[int | None] = mapped_column(BigCount)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())


class ConversationMessage(Base):
    """One turn of a conversation, in order (position from 0)."""

    __tablename__ = "conversation_messages"

    conversation_id: Mapped[str] = mapped_column(ForeignKey("conversations.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    content: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class OidcIdentity(Base):
    """The stable link from a person at the organisation's identity provider (its issuer and their `sub`, which
    never changes, unlike a user name or an email) to their account here (web/people/oidc)."""

    __tablename__ = "oidc_identities"

    issuer: Mapped[str] = mapped_column(String(255), primary_key=True)
    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())


class EndUser(Base):
    """A person behind a trusted front-end key, as the front end names them (web/keys/front_end.py): their own
    fair-share tenant and their own quota, counted here as user_usage counts a person's; plan_id none: the front
    end's end-user plan. They go with their key."""

    __tablename__ = "end_users"
    __table_args__ = (Index("uq_end_users_key_id_name", "key_id", "name", unique=True),)

    id: Mapped[int] = mapped_column(BigCount, primary_key=True)
    key_id: Mapped[int] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(256))
    plan_id: Mapped[int | None] = mapped_column(ForeignKey("plans.id", ondelete="SET NULL"))
    period_start: Mapped[datetime] = mapped_column(UTCDateTime())
    used_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    reserved_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_tokens: Mapped[int] = mapped_column(BigCount, default=0)
    total_requests: Mapped[int] = mapped_column(BigCount, default=0)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime())
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
