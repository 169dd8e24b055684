"""Admin JSON API for people (HTTP Basic, like /admin/api/keys): list, create, import CSV, change role (approve),
suspend, reset password, set plan, delete; sign someone out everywhere; invite links. The last active admin can be
neither suspended, demoted nor deleted (409 last_admin)."""

from typing import Annotated, Any, Literal

from litestar import Router, delete, get, patch, post
from litestar.params import FromPath, JSONBody
from litestar.types import Guard
from msgspec import UNSET, Meta, Struct, UnsetType

from web import deps
from web.keys.info import Priority
from web.keys.periods import Period
from web.keys.schemas import Limit, Weight
from web.people.accounts import Person
from web.people.passwords import MAX_PASSWORD_CHARS, MIN_PASSWORD_CHARS
from web.people.plans_api import ModelName

Id = Annotated[int, Meta(ge=1, le=2**63 - 1)]
Role = Literal["admin", "user", "pending"]
Username = Annotated[
    str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$", description="compared lower-case; 1 to 64 characters")
]
Password = Annotated[str, Meta(min_length=MIN_PASSWORD_CHARS, max_length=MAX_PASSWORD_CHARS)]


class Overrides(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """A person's own limits over their plan's: only the fields given replace the plan's (null: no limit)."""

    max_tokens_per_request: Limit | UnsetType | None = UNSET
    quota_tokens: Limit | UnsetType | None = UNSET
    quota_period: Period | UnsetType = UNSET
    max_concurrent: Limit | UnsetType | None = UNSET
    weight: Weight | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    allowed_models: list[ModelName] | UnsetType = UNSET

    def given(self) -> dict[str, Any]:
        """As web/people/plans.py keeps them (allowed_models as models)."""
        given = {f: getattr(self, f) for f in self.__struct_fields__ if getattr(self, f) is not UNSET}
        if "allowed_models" in given:
            given["models"] = given.pop("allowed_models")
        return given


class PersonView(Struct, kw_only=True):
    id: int
    username: str
    role: str
    suspended: bool
    plan_id: int | None
    overrides: dict[str, Any]


def view(person: Person) -> PersonView:
    return PersonView(
        id=person.id,
        username=person.username,
        role=person.role,
        suspended=person.suspended,
        plan_id=person.plan_id,
        overrides=person.overrides,
    )


class PersonCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    username: Username
    password: Password
    role: Role = "user"
    plan_id: Id | None = None


class PersonUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out keep their value."""

    role: Role | UnsetType = UNSET
    suspended: bool | UnsetType = UNSET
    plan_id: Id | UnsetType | None = UNSET
    overrides: Overrides | UnsetType = UNSET  # the person's own limits over their plan's ({} clears them)
    password: Password | UnsetType = UNSET


class CsvImport(Struct, kw_only=True, forbid_unknown_fields=True):
    csv: Annotated[str, Meta(max_length=1 << 20)]


class ImportResult(Struct, kw_only=True):
    created: list[str]
    errors: list[str]


class InviteCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    role: Role = "user"
    plan_id: Id | None = None
    days: Annotated[int, Meta(ge=1, le=90)] = 7


class InviteCreated(Struct, kw_only=True):
    token: str
    path: str  # /invite/<token>: give it to the person; it works once


@get("/users")
async def list_people(accounts: deps.Accounts) -> list[PersonView]:
    return [view(p) for p in await accounts.list()]


@post("/users", status_code=201)
async def create_person(accounts: deps.Accounts, data: JSONBody[PersonCreate]) -> PersonView:
    return view(await accounts.create(data.username, data.password, data.role, data.plan_id))


@post("/users/import", status_code=200)
async def import_people(enrolment: deps.Enrolment, data: JSONBody[CsvImport]) -> ImportResult:
    report = await enrolment.import_csv(data.csv)
    return ImportResult(created=report.created, errors=report.errors)


@get("/users/{user_id:int}")
async def get_person(accounts: deps.Accounts, user_id: FromPath[int]) -> PersonView:
    return view(await accounts.get(user_id))


@patch("/users/{user_id:int}")
async def update_person(accounts: deps.Accounts, user_id: FromPath[int], data: JSONBody[PersonUpdate]) -> PersonView:
    person = await accounts.get(user_id)
    if not isinstance(data.role, UnsetType):
        person = await accounts.set_role(user_id, data.role)
    if not isinstance(data.suspended, UnsetType):
        person = await accounts.set_suspended(user_id, data.suspended)
    if data.plan_id is not UNSET or not isinstance(data.overrides, UnsetType):
        plan_id = person.plan_id if data.plan_id is UNSET else data.plan_id
        overrides = None if isinstance(data.overrides, UnsetType) else data.overrides.given()
        person = await accounts.set_plan(user_id, plan_id if isinstance(plan_id, int) else None, overrides)
    if not isinstance(data.password, UnsetType):
        person = await accounts.set_password(user_id, data.password)
    return view(person)


@delete("/users/{user_id:int}", status_code=204)
async def delete_person(accounts: deps.Accounts, user_id: FromPath[int]) -> None:
    await accounts.delete(user_id)


@post("/users/{user_id:int}/sign-out", status_code=200)
async def sign_out_everywhere(
    accounts: deps.Accounts, web_sessions: deps.WebSessions, user_id: FromPath[int]
) -> dict[str, int]:
    await accounts.get(user_id)
    return {"ended": await web_sessions.end_all(user_id)}


@post("/invites", status_code=201)
async def create_invite(enrolment: deps.Enrolment, data: JSONBody[InviteCreate]) -> InviteCreated:
    token = await enrolment.invite(data.role, data.plan_id, data.days)
    return InviteCreated(token=token, path=f"/invite/{token}")


def people_api(admin_guard: Guard) -> Router:
    return Router(
        path="/admin/api",
        route_handlers=[
            list_people,
            create_person,
            import_people,
            get_person,
            update_person,
            delete_person,
            sign_out_everywhere,
            create_invite,
        ],
        guards=[admin_guard],
    )
