"""API keys and their token quotas: creation (shown once, stored hashed), authentication, atomic reservation
against the remaining quota, settlement to actual usage, and period rollover."""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, cast, get_args

from sqlalchemy import Row, Table, bindparam, delete, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from engine import Tenant
from web.errors import AuthenticationFailed, InvalidRequest, NotFound, StorageUnavailable
from web.history.writer import describe
from web.models import ApiKey, EndUser, KeyUsage, Plan, UserUsage, UTCDateTime, utcnow

log = logging.getLogger("web.keys")
KEY_PREFIX = "sk-"
VISIBLE_CHARS = 10  # "sk-" and 7 random characters: enough to recognise a key, useless to guess it
Period = Literal["day", "week", "month", "none"]
PERIODS: tuple[str, ...] = get_args(Period)
# The engine's priority classes (engine.Tenant.priority): interactive requests are admitted before batch ones.
Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[str, ...] = get_args(Priority)
# A weight is a share against other busy keys; beyond a million to one the counters say nothing more.
MIN_WEIGHT, MAX_WEIGHT = 1e-3, 1e6
# SQLite's INTEGER is 64-bit: no id beyond this range can exist, and no limit beyond it can be stored.
SQLITE_INT_MIN, SQLITE_INT_MAX = -(2**63), 2**63 - 1
_BY_HASH = select(ApiKey.__table__).where(ApiKey.__table__.c.key_hash == bindparam("digest"))
_BY_ID = select(ApiKey.__table__).where(ApiKey.__table__.c.id == bindparam("key_id"))
_usage = cast(Table, KeyUsage.__table__)
# The period rollover job: every key of a period kind whose period has ended starts afresh (reservations stay:
# they belong to requests in flight, which the ledger settles).
ROLL = (
    update(_usage)
    .where(
        _usage.c.key_id.in_(select(ApiKey.id).where(ApiKey.quota_period == bindparam("period"))),
        _usage.c.period_start < bindparam("start", type_=UTCDateTime()),
    )
    .values(used_tokens=0, period_start=bindparam("start", type_=UTCDateTime()))
)


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    """sha256 is right here: keys carry 256 random bits, so no stretching is needed against guessing."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def period_start(period: str, now: datetime, created_at: datetime) -> datetime:
    """Start of the quota period that contains `now` (UTC calendar: day, ISO week from Monday, month)."""
    day = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    return created_at


def next_period_start(period: str, start: datetime) -> datetime | None:
    if period == "day":
        return start + timedelta(days=1)
    if period == "week":
        return start + timedelta(days=7)
    if period == "month":
        return (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return None


@dataclass(frozen=True, slots=True)
class FrontEnd:
    """A key's trust as a front end: whether its requests may name their end users (each then their own tenant
    and quota), whether a name that is a person's account runs as that person, and the end users' plan."""

    enabled: bool = False
    accounts: bool = False
    plan_id: int | None = None


NOT_FRONT_END = FrontEnd()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a request needs to know about its key; a plain snapshot, detached from any session. A person signed
    in on the chat page comes with no key (id None) and their user_id."""

    id: int | None
    name: str
    prefix: str
    max_tokens_per_request: int | None
    quota_tokens: int | None
    quota_period: str
    max_concurrent: int | None
    created_at: datetime
    revoked_at: datetime | None
    weight: float
    priority: str
    # A personal key: its owner's id; the limits above are the owner's plan's (web/people/plans.py), the quota
    # counted is the owner's, from `quota_since` (when the person was made).
    user_id: int | None = None
    models: tuple[str, ...] = ()  # the served names it may use; empty: all
    quota_since: datetime | None = None
    front_end: FrontEnd = NOT_FRONT_END
    # A front end's end user (web/keys/front_end.py): the limits above are theirs, the quota counted theirs.
    end_user_id: int | None = None
    end_user: str | None = None

    @classmethod
    def of(cls, row: ApiKey | Row[Any]) -> KeyInfo:
        return cls(
            row.id,
            row.name,
            row.prefix,
            row.max_tokens_per_request,
            row.quota_tokens,
            row.quota_period,
            row.max_concurrent,
            row.created_at,
            row.revoked_at,
            row.weight,
            row.priority,
            row.user_id,
            front_end=FrontEnd(row.front_end, row.front_end_accounts, row.front_end_plan_id),
        )

    @property
    def tenant(self) -> Tenant:
        """Who the engine's fair scheduler and the gateway's fair queue count this key's requests against: its
        owner, whichever of their keys or sessions a request comes by; a key of no one is its own tenant."""
        if self.user_id is not None:
            tenant_id = f"user:{self.user_id}"
        elif self.end_user is not None:  # one of a front end's people: a tenant of their own
            tenant_id = f"fe:{self.id}:{self.end_user}"
        else:
            tenant_id = str(self.id)
        return Tenant(tenant_id, self.weight, cast(Priority, self.priority))

    @property
    def holder(self) -> int | str:
        """Whose concurrency slots and quota a request takes: the owner's, or the key's own."""
        return holder_of(self.id, self.user_id, self.end_user_id)

    @property
    def limits(self) -> KeyLimits:
        return KeyLimits(
            self.max_tokens_per_request,
            self.quota_tokens,
            self.quota_period,
            self.max_concurrent,
            self.weight,
            self.priority,
        )

    def running_under(self, limits: KeyLimits, models: tuple[str, ...], quota_since: datetime, **who: Any) -> KeyInfo:
        """This key as a request runs it under someone else's limits (a personal key's owner's plan, a front end's
        end user's): the one place a plan's limits are copied onto a key; `who` names whose they are."""
        return replace(self, **asdict(limits), models=models, quota_since=quota_since, **who)

    @property
    def stored_id(self) -> int:
        """The id of a key that exists: every KeyInfo but a signed-in person's (who comes with no key)."""
        assert self.id is not None, "a request without a key is a signed-in person's"
        return self.id

    @classmethod
    def signed_in(cls, user_id: int, username: str, created_at: datetime) -> KeyInfo:
        """A person on the chat page, who comes by their session and with no key: their plan's limits are set
        on it as on their personal keys (web/people/plans.py)."""
        return cls(None, username, "", None, None, "none", None, created_at, None, 1.0, "interactive", user_id)

    @property
    def period_anchor(self) -> datetime:
        """Where a quota of period "none" counts from."""
        return self.quota_since or self.created_at


def person_holder(user_id: int) -> str:
    return f"user:{user_id}"


def holder_of(key_id: int | None, user_id: int | None, end_user_id: int | None) -> int | str:
    """Whose concurrency slots a request takes: its person's, else its end user's, else its key's."""
    if user_id is not None:
        return person_holder(user_id)
    if end_user_id is not None:
        return f"fe:{end_user_id}"
    assert key_id is not None, "a request without a key is a signed-in person's"
    return key_id


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The admin-settable limits of a key; None means no limit."""

    max_tokens_per_request: int | None = None
    quota_tokens: int | None = None
    quota_period: str = "none"
    max_concurrent: int | None = None
    weight: float = 1.0
    priority: str = "interactive"

    def check(self) -> None:
        if self.quota_period not in PERIODS:
            raise InvalidRequest(f"quota_period must be one of {', '.join(PERIODS)}", param="quota_period")
        if self.priority not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
        if isinstance(self.weight, bool) or not (
            math.isfinite(self.weight) and MIN_WEIGHT <= self.weight <= MAX_WEIGHT
        ):
            raise InvalidRequest(f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}", param="weight")
        for name in ("max_tokens_per_request", "quota_tokens", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= SQLITE_INT_MAX:
                raise InvalidRequest(
                    f"{name} must be between 1 and {SQLITE_INT_MAX} (or null for no limit)", param=name
                )


async def _check_plan(session: AsyncSession, front_end: FrontEnd) -> None:
    plan_id = front_end.plan_id
    if plan_id is not None and (not 0 < plan_id <= SQLITE_INT_MAX or await session.get(Plan, plan_id) is None):
        raise NotFound(f"no plan with id {plan_id}", param="front_end_plan_id")


def _check_id(key_id: int) -> None:
    """An id SQLite cannot hold names no key (and would not reach the query: the driver refuses it)."""
    if not SQLITE_INT_MIN <= key_id <= SQLITE_INT_MAX:
        raise NotFound(f"no API key with id {key_id}", param="key_id")


class KeyService:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], db: AsyncEngine) -> None:
        self.sessions = sessions
        self.db = db

    async def authenticate(self, presented: str | None) -> KeyInfo:
        if not presented:
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer sk-...'", code="missing_api_key"
            )
        digest = hash_key(presented)
        try:
            async with self.db.connect() as conn:  # Core, not a session: this runs on every request
                row = (await conn.execute(_BY_HASH, {"digest": digest})).first()
        except (SQLAlchemyError, OSError) as exc:  # a database server down or restarting (asyncpg: OSError)
            log.error("the database cannot check an API key: %s", describe(exc))
            raise StorageUnavailable("API keys cannot be checked right now; retry shortly") from None
        if row is None or not hmac.compare_digest(row.key_hash, digest):
            raise AuthenticationFailed("incorrect API key provided")
        if row.revoked_at is not None:
            raise AuthenticationFailed("this API key has been revoked", code="revoked_api_key")
        return KeyInfo.of(row)

    async def keyless(self, key_id: int) -> KeyInfo:
        """The key a request without a credential runs as (web/keys/keyless.py): missing or revoked, the request
        needs a key of its own."""
        try:
            async with self.db.connect() as conn:
                row = (await conn.execute(_BY_ID, {"key_id": key_id})).first()
        except (SQLAlchemyError, OSError) as exc:
            log.error("the database cannot check the keyless key: %s", describe(exc))
            raise StorageUnavailable("API keys cannot be checked right now; retry shortly") from None
        if row is None or row.revoked_at is not None:
            log.warning("APPLIANCE_KEYLESS_KEY_ID=%d names no live key: requests without a key are refused", key_id)
            raise AuthenticationFailed(
                "missing API key: send it as 'Authorization: Bearer sk-...'", code="missing_api_key"
            )
        return KeyInfo.of(row)

    async def create(
        self, name: str, limits: KeyLimits, user_id: int | None = None, front_end: FrontEnd = NOT_FRONT_END
    ) -> tuple[KeyInfo, str]:
        """Returns the key's info and the key itself, which is never available again. A personal key (user_id)
        keeps no limits of its own: its owner's plan gives them."""
        limits.check()
        if not name.strip():
            raise InvalidRequest("name must not be blank", param="name")
        key, now = generate_key(), utcnow()
        row = ApiKey(
            name=name.strip(),
            prefix=key[:VISIBLE_CHARS],
            key_hash=hash_key(key),
            created_at=now,
            max_tokens_per_request=limits.max_tokens_per_request,
            quota_tokens=limits.quota_tokens,
            quota_period=limits.quota_period,
            max_concurrent=limits.max_concurrent,
            weight=limits.weight,
            priority=limits.priority,
            user_id=user_id,
            front_end=front_end.enabled,
            front_end_accounts=front_end.accounts,
            front_end_plan_id=front_end.plan_id,
        )
        async with self.sessions.begin() as session:
            await _check_plan(session, front_end)
            session.add(row)
            await session.flush()
            start = period_start(limits.quota_period, now, now)
            session.add(KeyUsage(key_id=row.id, period_start=start, used_tokens=0, reserved_tokens=0))
        return KeyInfo.of(row), key

    async def update(
        self, key_id: int, name: str | None, limits: KeyLimits, front_end: FrontEnd | None = None
    ) -> KeyInfo:
        """front_end None: the key's front-end settings stay as they are."""
        limits.check()
        async with self.sessions.begin() as session:
            row = await self._get(session, key_id)
            if front_end is not None:
                await _check_plan(session, front_end)
                row.front_end, row.front_end_accounts = front_end.enabled, front_end.accounts
                row.front_end_plan_id = front_end.plan_id
            if name is not None:
                if not name.strip():
                    raise InvalidRequest("name must not be blank", param="name")
                row.name = name.strip()
            if row.quota_period != limits.quota_period:
                # A new period kind starts counting afresh.
                now = utcnow()
                await session.execute(
                    update(KeyUsage)
                    .where(KeyUsage.key_id == key_id)
                    .values(used_tokens=0, period_start=period_start(limits.quota_period, now, now))
                )
            row.max_tokens_per_request = limits.max_tokens_per_request
            row.quota_tokens = limits.quota_tokens
            row.quota_period = limits.quota_period
            row.max_concurrent = limits.max_concurrent
            row.weight = limits.weight
            row.priority = limits.priority
        return KeyInfo.of(row)

    async def revoke(self, key_id: int) -> KeyInfo:
        async with self.sessions.begin() as session:
            row = await self._get(session, key_id)
            if row.revoked_at is None:
                row.revoked_at = utcnow()
        return KeyInfo.of(row)

    async def delete(self, key_id: int) -> None:
        _check_id(key_id)
        async with self.sessions.begin() as session:
            result = await session.execute(delete(ApiKey).where(ApiKey.id == key_id))
            if result.rowcount == 0:  # type: ignore[attr-defined]
                raise NotFound(f"no API key with id {key_id}", param="key_id")

    async def list_with_usage(self) -> list[tuple[KeyInfo, KeyUsage | None]]:
        async with self.sessions() as session:
            rows = await session.execute(
                select(ApiKey, KeyUsage).outerjoin(KeyUsage, KeyUsage.key_id == ApiKey.id).order_by(ApiKey.id)
            )
            return [(KeyInfo.of(key), usage) for key, usage in rows]

    async def names(self) -> dict[int, str]:
        async with self.sessions() as session:
            return {row.id: row.name for row in await session.execute(select(ApiKey.id, ApiKey.name))}

    async def get_with_usage(self, key_id: int) -> tuple[KeyInfo, KeyUsage | None]:
        async with self.sessions() as session:
            row = await self._get(session, key_id)
            usage = await session.get(KeyUsage, key_id)
            return KeyInfo.of(row), usage

    async def _get(self, session: AsyncSession, key_id: int) -> ApiKey:
        _check_id(key_id)
        row = await session.get(ApiKey, key_id)
        if row is None:
            raise NotFound(f"no API key with id {key_id}", param="key_id")
        return row

    # -- quota: remaining, roll over, recovery -------------------------------------------------------

    async def remaining(self, key: KeyInfo) -> int | None:
        if key.quota_tokens is None:
            return None
        async with self.sessions() as session:
            usage: KeyUsage | UserUsage | EndUser | None
            if key.user_id is not None:  # a personal key: its owner's quota
                usage = await session.get(UserUsage, key.user_id)
            elif key.end_user_id is not None:  # a front end's end user: theirs
                usage = await session.get(EndUser, key.end_user_id)
            else:
                usage = await session.get(KeyUsage, key.id)
        if usage is None:
            return key.quota_tokens
        return max(key.quota_tokens - usage.used_tokens - usage.reserved_tokens, 0)

    async def roll_over_all(self, now: datetime | None = None) -> int:
        """Reset every key whose quota period has ended; returns how many were reset."""
        now = now or utcnow()
        count = 0
        async with self.sessions.begin() as session:
            for period in ("day", "week", "month"):
                result = await session.execute(ROLL, {"period": period, "start": period_start(period, now, now)})
                count += result.rowcount  # type: ignore[attr-defined]
        return count
