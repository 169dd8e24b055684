"""The console's API keys page: create (the key is shown once, with a copy button), edit limits, revoke, and
each key's usage against its quota. Every change goes through KeyService."""

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect
from msgspec import Struct

from web import deps
from web.console.auth import page_context
from web.console.render import fragment, render, wanted_partial
from web.errors import AppError
from web.keys.info import PRIORITIES, FrontEnd, KeyLimits
from web.keys.periods import PERIODS
from web.keys.schemas import KeyView

Form = Annotated["KeyForm", Body(media_type=RequestEncodingType.URL_ENCODED)]
CHOICES = {"periods": PERIODS, "priorities": PRIORITIES}  # the key form's select boxes


class KeyForm(Struct, kw_only=True):
    """The create and edit forms; empty number fields mean "no limit"."""

    name: str = ""
    max_tokens_per_request: str = ""
    quota_tokens: str = ""
    quota_period: str = "none"
    max_concurrent: str = ""
    weight: str = "1"
    priority: str = "interactive"
    front_end: str = ""  # a checkbox: "on" when ticked, absent when not
    front_end_accounts: str = ""
    front_end_plan_id: str = ""
    csrf_token: str = ""


class FormError(ValueError):
    pass


def _limit(raw: str, label: str) -> int | None:
    text = raw.strip().replace(",", "").replace("_", "")
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise FormError(f"{label} must be a whole number, or empty for no limit") from None


def _weight(raw: str) -> float:
    text = raw.strip()
    if not text:
        return 1.0
    try:
        return float(text)
    except ValueError:
        raise FormError("Weight must be a number such as 1, 0.5 or 4") from None


def limits_of(form: KeyForm) -> KeyLimits:
    """Raises FormError or AppError (from KeyLimits.check) with a message for the form."""
    limits = KeyLimits(
        max_tokens_per_request=_limit(form.max_tokens_per_request, "Max tokens per request"),
        quota_tokens=_limit(form.quota_tokens, "Token quota"),
        quota_period=form.quota_period,
        max_concurrent=_limit(form.max_concurrent, "Concurrent requests"),
        weight=_weight(form.weight),
        priority=form.priority,
    )
    limits.check()
    return limits


def front_end_of(form: KeyForm) -> FrontEnd:
    plan_id = _limit(form.front_end_plan_id, "End-user plan id")
    return FrontEnd(bool(form.front_end), bool(form.front_end_accounts), plan_id)


def _is_htmx(request: HTMXRequest) -> bool:
    return bool(request.htmx)


def _create_partial(request: HTMXRequest) -> str | None:
    """The create form answers htmx with its own section (and the list out of band), a plain post with the page."""
    return "key-create" if _is_htmx(request) else None


def _page(
    request: HTMXRequest,
    views: list[KeyView],
    form: KeyForm,
    *,
    error: str | None = None,
    created: dict[str, Any] | None = None,
    oob: bool = False,
) -> dict[str, Any]:
    return page_context(request, "keys", keys=views, form=form, error=error, created=created, oob=oob, **CHOICES)


@get("/keys")
async def keys_page(request: HTMXRequest, views: deps.Views) -> Response[Any]:
    context = _page(request, await views.all(), KeyForm())
    return render("console/keys.html", context, partial=wanted_partial(request, ("keys-list",)))


@post("/keys")
async def create_key(request: HTMXRequest, keys: deps.Keys, views: deps.Views, data: Form) -> Response[Any]:
    try:
        info, secret = await keys.create(data.name, limits_of(data), front_end=front_end_of(data))
    except (FormError, AppError) as exc:
        message = exc.message if isinstance(exc, AppError) else str(exc)
        context = _page(request, await views.all(), data, error=message)
        return render("console/keys.html", context, partial=_create_partial(request), status_code=422)
    created = {"key": secret, "view": await views.one(info.stored_id)}
    context = _page(request, await views.all(), KeyForm(), created=created, oob=_is_htmx(request))
    return render("console/keys.html", context, partial=_create_partial(request), status_code=201)


@get("/keys/{key_id:int}")
async def key_card(request: HTMXRequest, views: deps.Views, key_id: FromPath[int]) -> Response[Any]:
    if not _is_htmx(request):
        return Redirect(f"/admin/keys#key-{key_id}", status_code=303)
    context = page_context(request, "keys", key=await views.one(key_id))
    return fragment("key-card", context)


@get("/keys/{key_id:int}/end-users")
async def end_users_page(
    request: HTMXRequest, views: deps.Views, front_ends: deps.FrontEnds, key_id: FromPath[int]
) -> Response[Any]:
    """A front-end key's end users: name, usage, last seen, each with a link to their history."""
    context = page_context(request, "keys", key=await views.one(key_id), end_users=await front_ends.end_users(key_id))
    return render("console/end-users.html", context)


@get("/keys/{key_id:int}/edit")
async def edit_key_form(request: HTMXRequest, views: deps.Views, key_id: FromPath[int]) -> Response[Any]:
    if not _is_htmx(request):
        return Redirect(f"/admin/keys#key-{key_id}", status_code=303)
    context = page_context(request, "keys", key=await views.one(key_id), error=None, form=None, **CHOICES)
    return fragment("key-edit", context)


@post("/keys/{key_id:int}")
async def update_key(
    request: HTMXRequest, keys: deps.Keys, views: deps.Views, key_id: FromPath[int], data: Form
) -> Response[Any]:
    try:
        await keys.update(key_id, data.name, limits_of(data), front_end_of(data))
    except (FormError, AppError) as exc:
        message = exc.message if isinstance(exc, AppError) else str(exc)
        view = await views.one(key_id)
        context = page_context(request, "keys", key=view, error=message, form=data, **CHOICES)
        return fragment("key-edit", context, status_code=422)
    if not _is_htmx(request):
        return Redirect(f"/admin/keys#key-{key_id}", status_code=303)
    return fragment("key-card", page_context(request, "keys", key=await views.one(key_id)))


@post("/keys/{key_id:int}/revoke")
async def revoke_key(request: HTMXRequest, keys: deps.Keys, views: deps.Views, key_id: FromPath[int]) -> Response[Any]:
    await keys.revoke(key_id)
    if not _is_htmx(request):
        return Redirect(f"/admin/keys#key-{key_id}", status_code=303)
    return fragment("key-card", page_context(request, "keys", key=await views.one(key_id)))
