"""Plans: named sets of limits (max_tokens cap, token quota and period, concurrency, weight, class, models) given
to people, with each person's own overrides on top; and what a person's key or session runs under: their plan's
limits, their quota, and them as the tenant of fair share."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, Row, Select, Table, bindparam, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.db import SQLITE_INT_MAX
from web.errors import AuthenticationFailed, InvalidRequest, NameTaken, NotFound
from web.keys.info import KeyInfo, KeyLimits
from web.models import Plan, User, utcnow

LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(KeyLimits))
OVERRIDABLE = (*LIMIT_FIELDS, "models")
_USERS, PLANS = cast(Table, User.__table__), cast(Table, Plan.__table__)
# A person's standing and plan, read beside the row that names them (a key's owner, a session's person) in the
# same query, the users and plans tables joined (`with_owner`, web/people/sessions.py): every request by a person's
# key or session needs them, and a second round trip to the database cost each such request about 1 ms more on an
# idle gateway. Labelled: a key's columns have the same names.
OWNER_COLUMNS = (
    _USERS.c.id.label("owner_id"),
    _USERS.c.role.label("owner_role"),
    _USERS.c.suspended.label("owner_suspended"),
    _USERS.c.overrides.label("owner_overrides"),
    _USERS.c.created_at.label("owner_since"),
    PLANS.c.id.label("plan_id"),
    PLANS.c.name.label("plan_name"),
    PLANS.c.models.label("plan_models"),
    *(PLANS.c[name].label(f"plan_{name}") for name in LIMIT_FIELDS),
)


@dataclass(frozen=True, slots=True)
class PlanInfo:
    id: int
    name: str
    limits: KeyLimits
    models: tuple[str, ...]  # empty: every model

    @classmethod
    def of(cls, row: Plan) -> PlanInfo:
        limits = KeyLimits(
            row.max_tokens_per_request,
            row.quota_tokens,
            row.quota_period,
            row.max_concurrent,
            row.weight,
            row.priority,
        )
        return cls(row.id, row.name, limits, _models(row.models))


def with_owner(table: Table, user_id: ColumnElement[Any]) -> Select[Any]:
    """The table's rows with the standing and plan of the person `user_id` names beside them (NULL where it names
    no one): what `Owner.of` reads."""
    joined = table.outerjoin(_USERS, _USERS.c.id == user_id).outerjoin(PLANS, PLANS.c.id == _USERS.c.plan_id)
    return select(table, *OWNER_COLUMNS).select_from(joined)


_PERSON = (
    select(*OWNER_COLUMNS)
    .select_from(_USERS.outerjoin(PLANS, PLANS.c.id == _USERS.c.plan_id))
    .where(_USERS.c.id == bindparam("user_id"))
)


@dataclass(frozen=True, slots=True)
class Owner:
    """A person as their requests run: whether they may, under which limits and models, and their quota counted
    from when they were made."""

    may_run: bool  # neither suspended nor awaiting approval
    since: datetime
    limits: KeyLimits
    models: tuple[str, ...]

    @classmethod
    def of(cls, row: Row[Any]) -> Owner | None:
        """From a row of a `with_owner` query; None where it names no one (or no one that exists)."""
        if row.owner_id is None:
            return None
        plan = None
        if row.plan_id is not None:
            limits = KeyLimits(*(getattr(row, f"plan_{name}") for name in LIMIT_FIELDS))
            plan = PlanInfo(row.plan_id, row.plan_name, limits, _models(row.plan_models))
        limits, models = effective(plan, json.loads(row.owner_overrides or "{}"))
        may_run = not row.owner_suspended and row.owner_role != "pending"
        return cls(may_run, row.owner_since, limits, models)


def run_as_owner(key: KeyInfo, owner: Owner | None) -> KeyInfo:
    """A person's key or session as its requests run: its owner's limits, models and quota; refused while the
    owner is suspended or not yet approved. A key of no one runs as itself."""
    if key.user_id is None:
        return key
    if owner is None:
        raise AuthenticationFailed("this API key's owner no longer exists")
    if not owner.may_run:
        raise AuthenticationFailed("this API key's owner is suspended or not approved", code="revoked_api_key")
    return key.running_under(owner.limits, owner.models, owner.since)


def _models(text: str) -> tuple[str, ...]:
    return tuple(json.loads(text or "[]"))


def check_models(models: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The names as served names are compared: stripped, blanks dropped, each once."""
    return tuple(dict.fromkeys(m.strip() for m in models if m.strip()))


def effective(plan: PlanInfo | None, overrides: dict[str, Any]) -> tuple[KeyLimits, tuple[str, ...]]:
    """A person's limits: their plan's (none: no limits, every model), each overridden field replaced."""
    limits, models = (plan.limits, plan.models) if plan is not None else (KeyLimits(), ())
    own = {k: v for k, v in overrides.items() if k in LIMIT_FIELDS}
    if own:
        limits = dataclasses.replace(limits, **own)
    if "models" in overrides:
        models = tuple(overrides["models"])
    return limits, models


def check_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(overrides) - set(OVERRIDABLE))
    if unknown:
        raise InvalidRequest(f"no such limit to override: {', '.join(unknown)}", param="overrides")
    limits, _ = effective(None, overrides)
    limits.check()
    if "models" in overrides:
        if not isinstance(overrides["models"], list) or not all(isinstance(m, str) for m in overrides["models"]):
            raise InvalidRequest("models is a list of model names", param="overrides")
        overrides = {**overrides, "models": list(check_models(overrides["models"]))}
    return overrides


class Plans:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def create(self, name: str, limits: KeyLimits, models: list[str] | tuple[str, ...] = ()) -> PlanInfo:
        limits.check()
        if not name.strip() or len(name.strip()) > 100:
            raise InvalidRequest("a plan's name has 1 to 100 characters", param="name")
        row = Plan(name=name.strip(), models=json.dumps(check_models(models)), created_at=utcnow())
        _set_limits(row, limits)
        try:
            async with self.sessions.begin() as session:
                session.add(row)
        except IntegrityError:
            raise NameTaken(f"a plan named {name.strip()!r} exists", param="name") from None
        return PlanInfo.of(row)

    async def update(self, plan_id: int, limits: KeyLimits, models: list[str] | tuple[str, ...]) -> PlanInfo:
        limits.check()
        async with self.sessions.begin() as session:
            row = await self._row(session, plan_id)
            _set_limits(row, limits)
            row.models = json.dumps(check_models(models))
        return PlanInfo.of(row)

    async def list(self) -> list[PlanInfo]:
        async with self.sessions() as session:
            return [PlanInfo.of(row) for row in await session.scalars(select(Plan).order_by(Plan.name))]

    async def get(self, plan_id: int) -> PlanInfo:
        async with self.sessions() as session:
            return PlanInfo.of(await self._row(session, plan_id))

    async def owner(self, user_id: int) -> Owner:
        """A person as their requests run (standing, plan and overrides), in one query."""
        async with self.sessions() as session:
            row = (await session.execute(_PERSON, {"user_id": user_id})).first()
        owner = None if row is None else Owner.of(row)
        if owner is None:
            raise AuthenticationFailed("this API key's owner no longer exists")
        return owner

    async def apply(self, key: KeyInfo) -> KeyInfo:
        """A person's key as its requests run (`run_as_owner`). An API key's own lookup and a session's read their
        person in the same query as themselves (web/keys/service.py, web/people/sessions.py): this is for the rest
        (a front end's person)."""
        if key.user_id is None:
            return key
        return run_as_owner(key, await self.owner(key.user_id))

    async def _row(self, session: AsyncSession, plan_id: int) -> Plan:
        row = await session.get(Plan, plan_id) if 0 < plan_id <= SQLITE_INT_MAX else None
        if row is None:
            raise NotFound(f"no plan with id {plan_id}", param="plan_id")
        return row


def _set_limits(row: Plan, limits: KeyLimits) -> None:
    for name in LIMIT_FIELDS:
        setattr(row, name, getattr(limits, name))
