"""Admin JSON API for keys: list, create (the key is shown once), read, update, revoke, delete, and a front-end
key's end users."""

from typing import Any

from litestar import Router, delete, get, patch, post
from litestar.params import FromPath, JSONBody
from litestar.types import Guard
from msgspec import UNSET

from web import deps
from web.keys.info import FrontEnd, KeyLimits
from web.keys.schemas import CreatedKey, EndUserView, KeyCreate, KeyUpdate, KeyView


@get("/")
async def list_keys(views: deps.Views) -> list[KeyView]:
    return await views.all()


@post("/", status_code=201)
async def create_key(keys: deps.Keys, views: deps.Views, data: JSONBody[KeyCreate]) -> CreatedKey:
    limits = KeyLimits(
        data.max_tokens_per_request,
        data.quota_tokens,
        data.quota_period,
        data.max_concurrent,
        data.weight,
        data.priority,
    )
    front_end = FrontEnd(data.front_end, data.front_end_accounts, data.front_end_plan_id)
    info, key = await keys.create(data.name, limits, front_end=front_end)
    return CreatedKey(key=key, info=await views.one(info.stored_id))


@get("/{key_id:int}")
async def get_key(views: deps.Views, key_id: FromPath[int]) -> KeyView:
    return await views.one(key_id)


@patch("/{key_id:int}")
async def update_key(keys: deps.Keys, views: deps.Views, key_id: FromPath[int], data: JSONBody[KeyUpdate]) -> KeyView:
    current, _ = await keys.get_with_usage(key_id)

    def pick(value: Any, default: Any) -> Any:
        return default if value is UNSET else value

    limits = KeyLimits(
        pick(data.max_tokens_per_request, current.max_tokens_per_request),
        pick(data.quota_tokens, current.quota_tokens),
        pick(data.quota_period, current.quota_period),
        pick(data.max_concurrent, current.max_concurrent),
        pick(data.weight, current.weight),
        pick(data.priority, current.priority),
    )
    front_end = FrontEnd(
        pick(data.front_end, current.front_end.enabled),
        pick(data.front_end_accounts, current.front_end.accounts),
        pick(data.front_end_plan_id, current.front_end.plan_id),
    )
    name = None if data.name is UNSET else data.name
    await keys.update(key_id, name, limits, front_end)
    return await views.one(key_id)


@post("/{key_id:int}/revoke", status_code=200)
async def revoke_key(keys: deps.Keys, views: deps.Views, key_id: FromPath[int]) -> KeyView:
    await keys.revoke(key_id)
    return await views.one(key_id)


@get("/{key_id:int}/end-users")
async def list_end_users(front_ends: deps.FrontEnds, key_id: FromPath[int]) -> list[EndUserView]:
    """The people a front-end key's requests named, the most recently seen first."""
    return await front_ends.end_users(key_id)


@delete("/{key_id:int}", status_code=204)
async def delete_key(keys: deps.Keys, key_id: FromPath[int]) -> None:
    await keys.delete(key_id)


def keys_router(admin_guard: Guard) -> Router:
    return Router(
        path="/admin/api/keys",
        route_handlers=[list_keys, create_key, get_key, update_key, revoke_key, delete_key, list_end_users],
        guards=[admin_guard],
    )
