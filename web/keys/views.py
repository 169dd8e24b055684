"""Keys as the admin sees them: each key's limits with its usage against its quota and its requests in flight."""

from __future__ import annotations

from web.keys.info import KeyInfo
from web.keys.limiter import ConcurrencyLimiter
from web.keys.periods import next_period_start
from web.keys.schemas import KeyView, UsageView
from web.keys.service import KeyService
from web.models import KeyUsage


class KeyViews:
    def __init__(self, keys: KeyService, limiter: ConcurrencyLimiter) -> None:
        self.keys = keys
        self.limiter = limiter

    async def all(self) -> list[KeyView]:
        return [
            key_view(key, usage, self.limiter.in_flight(key.holder)) for key, usage in await self.keys.list_with_usage()
        ]

    async def one(self, key_id: int) -> KeyView:
        key, usage = await self.keys.get_with_usage(key_id)
        return key_view(key, usage, self.limiter.in_flight(key.holder))


def key_view(key: KeyInfo, usage: KeyUsage | None, in_flight: int) -> KeyView:
    used = usage.used_tokens if usage else 0
    reserved = usage.reserved_tokens if usage else 0
    remaining = None if key.quota_tokens is None else max(key.quota_tokens - used - reserved, 0)
    start = usage.period_start if usage else None
    end = next_period_start(key.quota_period, start) if start is not None else None
    return KeyView(
        id=key.stored_id,
        name=key.name,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        max_tokens_per_request=key.max_tokens_per_request,
        quota_tokens=key.quota_tokens,
        quota_period=key.quota_period,
        max_concurrent=key.max_concurrent,
        weight=key.weight,
        priority=key.priority,
        front_end=key.front_end.enabled,
        front_end_accounts=key.front_end.accounts,
        front_end_plan_id=key.front_end.plan_id,
        usage=UsageView(
            period_start=start,
            period_end=end,
            used_tokens=used,
            reserved_tokens=reserved,
            remaining_tokens=remaining,
            total_tokens=usage.total_tokens if usage else 0,
            total_requests=usage.total_requests if usage else 0,
            last_used_at=usage.last_used_at if usage else None,
            in_flight=in_flight,
        ),
    )
