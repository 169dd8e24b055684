"""API keys and their token quotas: creation (shown once, stored hashed), authentication, atomic reservation
against the remaining quota, settlement to actual usage, and period rollover."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from datetime import datetime
from typing import cast

from sqlalchemy import Table, bindparam, delete, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from web.db import SQLITE_INT_MAX, SQLITE_INT_MIN
from web.errors import AuthenticationFailed, InvalidRequest, NotFound, StorageUnavailable
from web.history.writer import describe
from web.keys.info import NOT_FRONT_END, FrontEnd, KeyInfo, KeyLimits
from web.keys.periods import period_start
from web.models import ApiKey, EndUser, KeyUsage, Plan, UserUsage, UTCDateTime, utcnow
from web.people.plans import Owner, run_as_owner, with_owner

log = logging.getLogger("web.keys")
KEY_PREFIX = "sk-"
VISIBLE_CHARS = 10  # "sk-" and 7 random characters: enough to recognise a key, useless to guess it
_KEYS = cast(Table, ApiKey.__table__)
# A key with its owner's standing and plan beside it, in one query: the key as its requests run.
_BY_HASH = with_owner(_KEYS, _KEYS.c.user_id).where(_KEYS.c.key_hash == bindparam("digest"))
_BY_ID = with_owner(_KEYS, _KEYS.c.user_id).where(_KEYS.c.id == bindparam("key_id"))
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
        """The key presented, as its requests run: a person's key under its owner's plan (web/people/plans.py)."""
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
        return run_as_owner(KeyInfo.of(row), Owner.of(row))

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
        return run_as_owner(KeyInfo.of(row), Owner.of(row))

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
