"""Quota arithmetic in SQL, on the request path: reserve (with period rollover) and settle, each one UPDATE.

The statements are built once with bind parameters and run as Core statements: building SQLAlchemy
expressions and ORM bookkeeping per request cost more CPU than the database work itself."""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import Integer, Table, bindparam, case, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from web.models import ApiKey, KeyUsage, UTCDateTime

_usage = cast(Table, KeyUsage.__table__)
_keys = cast(Table, ApiKey.__table__)

_rolled = _usage.c.period_start < bindparam("start", type_=UTCDateTime())
_used = case((_rolled, 0), else_=_usage.c.used_tokens)
_quota = select(_keys.c.quota_tokens).where(_keys.c.id == _usage.c.key_id).scalar_subquery()

# Rolls the period over when it has ended, then reserves if used + reserved + n still fits the quota, all in one
# statement: SQLite applies writes one at a time, so concurrent requests of a key can never overspend it.
RESERVE = (
    update(_usage)
    .where(
        _usage.c.key_id == bindparam("kid", type_=Integer()),
        or_(_quota.is_(None), _used + _usage.c.reserved_tokens + bindparam("n", type_=Integer()) <= _quota),
    )
    .values(
        used_tokens=_used,
        period_start=case((_rolled, bindparam("start", type_=UTCDateTime())), else_=_usage.c.period_start),
        reserved_tokens=_usage.c.reserved_tokens + bindparam("n", type_=Integer()),
        last_used_at=bindparam("now", type_=UTCDateTime()),
    )
)

SETTLE = (
    update(_usage)
    .where(_usage.c.key_id == bindparam("kid", type_=Integer()))
    .values(
        reserved_tokens=func.max(_usage.c.reserved_tokens - bindparam("reserved", type_=Integer()), 0),
        used_tokens=_usage.c.used_tokens + bindparam("charged", type_=Integer()),
        total_tokens=_usage.c.total_tokens + bindparam("charged", type_=Integer()),
        total_requests=_usage.c.total_requests + 1,
    )
)

ROLL = (
    update(_usage)
    .where(
        _usage.c.key_id.in_(select(_keys.c.id).where(_keys.c.quota_period == bindparam("period"))),
        _rolled,
    )
    .values(used_tokens=0, period_start=bindparam("start", type_=UTCDateTime()))
)


async def reserve(conn: AsyncConnection, key_id: int, tokens: int, start: datetime, now: datetime) -> bool:
    """Reserve `tokens` in the caller's transaction; `start` is the start of the key's current period."""
    result = await conn.execute(RESERVE, {"kid": key_id, "n": tokens, "start": start, "now": now})
    return bool(result.rowcount)


async def settle(conn: AsyncConnection, key_id: int, reserved: int, charged: int) -> None:
    """Replace a reservation by what was actually used (prompt + generated tokens)."""
    await conn.execute(SETTLE, {"kid": key_id, "reserved": reserved, "charged": charged})
