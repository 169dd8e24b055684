"""Admin JSON API for keys: list, create (the key is shown once), read, update, revoke, delete."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, delete, get, patch, post
from litestar.params import FromPath, JSONBody
from msgspec import UNSET

from web.keys.schemas import CreatedKey, KeyCreate, KeyUpdate, KeyView, UsageView
from web.keys.service import KeyInfo, KeyLimits, next_period_start
from web.models import KeyUsage
from web.state import Services, services_of
from web.system.admin_auth import admin_guard

AnyRequest = Request[Any, Any, Any]


def key_view(services: Services, key: KeyInfo, usage: KeyUsage | None) -> KeyView:
    used = usage.used_tokens if usage else 0
    reserved = usage.reserved_tokens if usage else 0
    remaining = None if key.quota_tokens is None else max(key.quota_tokens - used - reserved, 0)
    start = usage.period_start if usage else None
    end = next_period_start(key.quota_period, start) if start is not None else None
    return KeyView(
        id=key.id,
        name=key.name,
        prefix=key.prefix,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
        max_tokens_per_request=key.max_tokens_per_request,
        quota_tokens=key.quota_tokens,
        quota_period=key.quota_period,
        max_concurrent=key.max_concurrent,
        usage=UsageView(
            period_start=start,
            period_end=end,
            used_tokens=used,
            reserved_tokens=reserved,
            remaining_tokens=remaining,
            total_tokens=usage.total_tokens if usage else 0,
            total_requests=usage.total_requests if usage else 0,
            last_used_at=usage.last_used_at if usage else None,
            in_flight=services.limiter.in_flight(key.id),
        ),
    )


@get("/")
async def list_keys(request: AnyRequest) -> list[KeyView]:
    services = services_of(request)
    return [key_view(services, key, usage) for key, usage in await services.keys.list_with_usage()]


@post("/", status_code=201)
async def create_key(request: AnyRequest, data: JSONBody[KeyCreate]) -> CreatedKey:
    services = services_of(request)
    limits = KeyLimits(data.max_tokens_per_request, data.quota_tokens, data.quota_period, data.max_concurrent)
    info, key = await services.keys.create(data.name, limits)
    _, usage = await services.keys.get_with_usage(info.id)
    return CreatedKey(key=key, info=key_view(services, info, usage))


@get("/{key_id:int}")
async def get_key(request: AnyRequest, key_id: FromPath[int]) -> KeyView:
    services = services_of(request)
    key, usage = await services.keys.get_with_usage(key_id)
    return key_view(services, key, usage)


@patch("/{key_id:int}")
async def update_key(request: AnyRequest, key_id: FromPath[int], data: JSONBody[KeyUpdate]) -> KeyView:
    services = services_of(request)
    current, _ = await services.keys.get_with_usage(key_id)

    def pick(value: Any, default: Any) -> Any:
        return default if value is UNSET else value

    limits = KeyLimits(
        pick(data.max_tokens_per_request, current.max_tokens_per_request),
        pick(data.quota_tokens, current.quota_tokens),
        pick(data.quota_period, current.quota_period),
        pick(data.max_concurrent, current.max_concurrent),
    )
    name = None if data.name is UNSET else data.name
    await services.keys.update(key_id, name, limits)
    key, usage = await services.keys.get_with_usage(key_id)
    return key_view(services, key, usage)


@post("/{key_id:int}/revoke", status_code=200)
async def revoke_key(request: AnyRequest, key_id: FromPath[int]) -> KeyView:
    services = services_of(request)
    await services.keys.revoke(key_id)
    key, usage = await services.keys.get_with_usage(key_id)
    return key_view(services, key, usage)


@delete("/{key_id:int}", status_code=204)
async def delete_key(request: AnyRequest, key_id: FromPath[int]) -> None:
    await services_of(request).keys.delete(key_id)


keys_router = Router(
    path="/admin/api/keys",
    route_handlers=[list_keys, create_key, get_key, update_key, revoke_key, delete_key],
    guards=[admin_guard],
)
