"""Admin JSON API for plans (HTTP Basic, like /admin/api/keys): list, create, read, update."""

from typing import Annotated

from litestar import Router, get, patch, post
from litestar.params import FromPath, JSONBody
from litestar.types import Guard
from msgspec import UNSET, Meta, Struct, UnsetType

from web import deps
from web.keys.info import KeyLimits, Priority
from web.keys.periods import Period
from web.keys.schemas import Limit, Weight
from web.people.plans import PlanInfo

ModelName = str  # blanks are dropped (web/people/plans.py check_models)
# Not "models": Litestar reads a body field's validation error under a dependency's name (deps.Models) as the
# server's fault (500).


class PlanView(Struct, kw_only=True):
    id: int
    name: str
    max_tokens_per_request: int | None
    quota_tokens: int | None
    quota_period: str
    max_concurrent: int | None
    weight: float
    priority: str
    allowed_models: list[str]  # empty: every model


class PlanCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, Meta(min_length=1, max_length=100, pattern=r"\S")]
    max_tokens_per_request: Limit | None = None
    quota_tokens: Limit | None = None
    quota_period: Period = "none"
    max_concurrent: Limit | None = None
    weight: Weight = 1.0
    priority: Priority = "interactive"
    allowed_models: list[ModelName] = []


class PlanUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out keep their value; null clears a limit."""

    max_tokens_per_request: Limit | UnsetType | None = UNSET
    quota_tokens: Limit | UnsetType | None = UNSET
    quota_period: Period | UnsetType = UNSET
    max_concurrent: Limit | UnsetType | None = UNSET
    weight: Weight | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    allowed_models: list[ModelName] | UnsetType = UNSET


def plan_view(plan: PlanInfo) -> PlanView:
    limits = plan.limits
    return PlanView(
        id=plan.id,
        name=plan.name,
        max_tokens_per_request=limits.max_tokens_per_request,
        quota_tokens=limits.quota_tokens,
        quota_period=limits.quota_period,
        max_concurrent=limits.max_concurrent,
        weight=limits.weight,
        priority=limits.priority,
        allowed_models=list(plan.models),
    )


@get("/")
async def list_plans(plans: deps.Plans) -> list[PlanView]:
    return [plan_view(p) for p in await plans.list()]


@post("/", status_code=201)
async def create_plan(plans: deps.Plans, data: JSONBody[PlanCreate]) -> PlanView:
    limits = KeyLimits(
        data.max_tokens_per_request,
        data.quota_tokens,
        data.quota_period,
        data.max_concurrent,
        data.weight,
        data.priority,
    )
    return plan_view(await plans.create(data.name, limits, data.allowed_models))


@get("/{plan_id:int}")
async def get_plan(plans: deps.Plans, plan_id: FromPath[int]) -> PlanView:
    return plan_view(await plans.get(plan_id))


@patch("/{plan_id:int}")
async def update_plan(plans: deps.Plans, plan_id: FromPath[int], data: JSONBody[PlanUpdate]) -> PlanView:
    current = await plans.get(plan_id)
    was = current.limits
    limits = KeyLimits(
        *(
            getattr(was, name) if getattr(data, name) is UNSET else getattr(data, name)
            for name in (
                "max_tokens_per_request",
                "quota_tokens",
                "quota_period",
                "max_concurrent",
                "weight",
                "priority",
            )
        )
    )
    models = current.models if isinstance(data.allowed_models, UnsetType) else data.allowed_models
    return plan_view(await plans.update(plan_id, limits, models))


def plans_api(admin_guard: Guard) -> Router:
    return Router(
        path="/admin/api/plans", route_handlers=[list_plans, create_plan, get_plan, update_plan], guards=[admin_guard]
    )
