"""The console's Plans page: each plan's limits and models, made and changed with the key form's fields (the same
limits a key carries) plus the models it allows."""

from typing import Annotated, Any

from litestar import Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect

from web import deps
from web.console.auth import page_context
from web.console.keys import CHOICES, FormError, KeyForm, limits_of
from web.console.render import render
from web.errors import AppError
from web.people.plans import Plans


class PlanForm(KeyForm, kw_only=True):
    models: str = ""  # comma- or line-separated; empty: every model


Form = Annotated[PlanForm, Body(media_type=RequestEncodingType.URL_ENCODED)]


def _models(raw: str) -> list[str]:
    return [m for m in raw.replace("\n", ",").split(",") if m.strip()]


async def _context(request: HTMXRequest, plans: Plans, **values: Any) -> dict[str, Any]:
    values = {"form": PlanForm(), "error": None, **values}
    return page_context(request, "plans", plans=await plans.list(), **CHOICES, **values)


@get("/plans")
async def plans_page(request: HTMXRequest, plans: deps.Plans) -> Response[Any]:
    return render("console/plans.html", await _context(request, plans))


@post("/plans")
async def create_plan(request: HTMXRequest, plans: deps.Plans, data: Form) -> Response[Any]:
    try:
        plan = await plans.create(data.name, limits_of(data), _models(data.models))
    except (FormError, AppError) as exc:
        message = exc.message if isinstance(exc, AppError) else str(exc)
        return render("console/plans.html", await _context(request, plans, error=message, form=data), status_code=422)
    return Redirect(f"/admin/plans#plan-{plan.id}", status_code=303)


@post("/plans/{plan_id:int}")
async def update_plan(request: HTMXRequest, plans: deps.Plans, plan_id: FromPath[int], data: Form) -> Response[Any]:
    await plans.get(plan_id)
    try:
        await plans.update(plan_id, limits_of(data), _models(data.models))
    except (FormError, AppError) as exc:
        message = exc.message if isinstance(exc, AppError) else str(exc)
        return render("console/plans.html", await _context(request, plans, error=message), status_code=422)
    return Redirect(f"/admin/plans#plan-{plan_id}", status_code=303)
