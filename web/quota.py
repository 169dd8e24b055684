"""The quota statements the ledger runs: reserve (the period rolled over when it has ended, then used + reserved
+ n checked against the quota, in one statement) and settle, for a key's own quota, for a person's, which all
their keys and sessions share, and for a front end's end user's. Built once with bind parameters (see
web/ledger.py for why)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import ColumnElement, Integer, Table, Update, bindparam, case, or_, select, update

from web.models import ApiKey, BigCount, EndUser, KeyUsage, UserUsage, UTCDateTime

_keys = cast(Table, ApiKey.__table__)
_key_usage = cast(Table, KeyUsage.__table__)
_person_usage = cast(Table, UserUsage.__table__)
_end_users = cast(Table, EndUser.__table__)
NO_QUOTA = 2**62  # a person's quota bound when their plan has none: nothing sums up to it


def _at_least_zero(value: Any) -> Any:
    """max(value, 0) in SQL that both dialects speak (SQLite's two-argument max is PostgreSQL's greatest)."""
    return case((value > 0, value), else_=0)


def _reserve(usage: Table, owner: ColumnElement[Any], quota: Any, unlimited: ColumnElement[bool] | None) -> Update:
    rolled = usage.c.period_start < bindparam("start", type_=UTCDateTime())
    used = case((rolled, 0), else_=usage.c.used_tokens)
    fits = used + usage.c.reserved_tokens + bindparam("n", type_=BigCount) <= quota
    return (
        update(usage)
        .where(owner == bindparam("kid", type_=Integer()), fits if unlimited is None else or_(unlimited, fits))
        .values(
            used_tokens=used,
            period_start=case((rolled, bindparam("start", type_=UTCDateTime())), else_=usage.c.period_start),
            reserved_tokens=usage.c.reserved_tokens + bindparam("n", type_=BigCount),
            last_used_at=bindparam("now", type_=UTCDateTime()),
        )
    )


def _settle(usage: Table, owner: ColumnElement[Any]) -> Update:
    return (
        update(usage)
        .where(owner == bindparam("kid", type_=Integer()))
        .values(
            reserved_tokens=_at_least_zero(usage.c.reserved_tokens - bindparam("reserved", type_=BigCount)),
            used_tokens=usage.c.used_tokens + bindparam("charged", type_=BigCount),
            total_tokens=usage.c.total_tokens + bindparam("charged", type_=BigCount),
            total_requests=usage.c.total_requests + 1,
        )
    )


# A key's quota is read in the statement itself (an admin's change applies to the next reservation); SQLite
# applies writes one at a time, so concurrent requests can never overspend it.
_key_quota = select(_keys.c.quota_tokens).where(_keys.c.id == _key_usage.c.key_id).scalar_subquery()
RESERVE = _reserve(_key_usage, _key_usage.c.key_id, _key_quota, _key_quota.is_(None))
SETTLE = _settle(_key_usage, _key_usage.c.key_id)
# A person's quota comes from their plan and overrides, read when their key or session was checked: bound as
# "quota" (NO_QUOTA for none), with "kid" their user id.
RESERVE_PERSON = _reserve(_person_usage, _person_usage.c.user_id, bindparam("quota", type_=BigCount), None)
SETTLE_PERSON = _settle(_person_usage, _person_usage.c.user_id)
# A front end's end user's quota comes from the front end's end-user plan (or the key's own limits), read when
# the request named them: bound as "quota", with "kid" the end_users row's id.
RESERVE_END_USER = _reserve(_end_users, _end_users.c.id, bindparam("quota", type_=BigCount), None)
SETTLE_END_USER = _settle(_end_users, _end_users.c.id)
