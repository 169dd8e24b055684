"""A signed-in person's own page, /account: their plan's limits, their usage against their quota this period,
their API keys (made here, shown once, revoked here), and sign-out everywhere. Only their own: every key id is
checked against the session's person."""

from datetime import datetime
from typing import Annotated, Any

from litestar import Request, Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.response import Redirect, Template
from msgspec import Struct

from web import deps
from web.console.render import PRIVATE_HEADERS
from web.keys.info import KeyLimits
from web.keys.periods import period_start
from web.models import UserUsage, utcnow
from web.people.guard import signed_in
from web.people.personal_keys import PersonalKeys
from web.people.plans import Plans


class KeyForm(Struct, kw_only=True):
    name: str = ""
    csrf_token: str = ""


def usage_numbers(limits: KeyLimits, usage: UserUsage | None, created_at: datetime, now: datetime) -> dict[str, Any]:
    """A person's usage this period against their limits (a period that has ended counts as nothing used yet),
    and in all: their own page shows it, and the console's People page shows it for everyone."""
    start = period_start(limits.quota_period, now, created_at)
    used = 0 if usage is None or usage.period_start < start else usage.used_tokens
    reserved = 0 if usage is None else usage.reserved_tokens
    remaining = None if limits.quota_tokens is None else max(limits.quota_tokens - used - reserved, 0)
    return {
        "limits": limits,
        "used": used,
        "reserved": reserved,
        "remaining": remaining,
        "total_tokens": 0 if usage is None else usage.total_tokens,
        "total_requests": 0 if usage is None else usage.total_requests,
    }


async def usage_of(plans: Plans, user_id: int, now: datetime) -> dict[str, Any]:
    """A person's limits, models and usage (usage_numbers)."""
    owner = await plans.owner(user_id)
    async with plans.sessions() as session:
        usage = await session.get(UserUsage, user_id)
    return {"models": owner.models, **usage_numbers(owner.limits, usage, owner.since, now)}


async def _page(
    request: Request[Any, Any, Any], plans: Plans, personal_keys: PersonalKeys, new_key: str | None = None
) -> Template:
    session = signed_in(request)
    person = session.person
    context = {
        "person": person,
        "csrf": session.csrf_token,
        "keys": await personal_keys.of(person.id),
        "new_key": new_key,
        **await usage_of(plans, person.id, utcnow()),
    }
    return Template("people/account.html", context=context, headers=PRIVATE_HEADERS)


@get("/account")
async def account_page(
    request: Request[Any, Any, Any], plans: deps.Plans, personal_keys: deps.PersonalKeys
) -> Template:
    return await _page(request, plans, personal_keys)


@post("/account/keys", status_code=201)
async def create_own_key(
    request: Request[Any, Any, Any],
    plans: deps.Plans,
    personal_keys: deps.PersonalKeys,
    data: Annotated[KeyForm, Body(media_type=RequestEncodingType.URL_ENCODED)],
) -> Template:
    """The page again, with the new key in it this once."""
    _, key = await personal_keys.create(signed_in(request).person.id, data.name.strip() or "my key")
    page = await _page(request, plans, personal_keys, new_key=key)
    page.status_code = 201
    return page


@post("/account/keys/{key_id:int}/revoke")
async def revoke_own_key(
    request: Request[Any, Any, Any], personal_keys: deps.PersonalKeys, key_id: FromPath[int]
) -> Response[Any]:
    await personal_keys.revoke(signed_in(request).person.id, key_id)
    return Redirect("/account", status_code=303)
