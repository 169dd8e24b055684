"""The console's People page: make a person (one, a CSV, an invite link), and for each person their role
(approve a sign-up), suspension, plan, a new password, sign-out everywhere, deletion, and their use against their
quota this period and in all, with a link to their history. Every change goes through web/people; each answers htmx
with the person's row (and the reason, where one was refused: the last active admin stays one)."""

import json
from dataclasses import dataclass
from typing import Annotated, Any

from litestar import Response, get, post
from litestar.enums import RequestEncodingType
from litestar.params import Body, FromPath
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect
from msgspec import Struct
from sqlalchemy import select

from web import deps
from web.console.auth import page_context
from web.console.render import fragment, render
from web.errors import AppError, InvalidRequest, LastAdmin
from web.keys.info import KeyLimits
from web.models import Plan, User, UserUsage, utcnow
from web.people.account import usage_numbers
from web.people.accounts import ROLES, Person
from web.people.plans import PlanInfo, Plans, effective


class PersonForm(Struct, kw_only=True):
    username: str = ""
    password: str = ""
    role: str = "user"
    plan_id: str = ""
    suspended: str = ""
    csv: str = ""
    csrf_token: str = ""


Form = Annotated[PersonForm, Body(media_type=RequestEncodingType.URL_ENCODED)]


@dataclass(frozen=True, slots=True)
class PersonRow:
    person: Person
    plan: str  # its name, "" for none
    limits: KeyLimits
    usage: dict[str, Any]  # web/people/account.py usage_numbers: this period's and all-time use


def _plan_id(raw: str) -> int | None:
    if not raw.strip():
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequest("choose a plan from the list") from None


async def people_rows(plans: Plans, user_id: int | None = None) -> list[PersonRow]:
    """Everyone (or one person) with their plan and use this period, in one query."""
    query = (
        select(User, Plan, UserUsage)
        .outerjoin(Plan, Plan.id == User.plan_id)
        .outerjoin(UserUsage, UserUsage.user_id == User.id)
        .order_by(User.username)
    )
    if user_id is not None:
        query = query.where(User.id == user_id)
    now, rows = utcnow(), []
    async with plans.sessions() as session:
        for user, plan, usage in await session.execute(query):
            limits, _ = effective(None if plan is None else PlanInfo.of(plan), json.loads(user.overrides or "{}"))
            numbers = usage_numbers(limits, usage, user.created_at, now)
            rows.append(PersonRow(Person.of(user), "" if plan is None else plan.name, limits, numbers))
    return rows


async def _context(request: HTMXRequest, plans: Plans, **values: Any) -> dict[str, Any]:
    values = {
        "error": None,
        "form": None,
        "report": None,
        "invite": None,
        "row_error": None,
        "error_row": None,
        **values,
    }
    return page_context(
        request, "people", people=await people_rows(plans), plans=await plans.list(), roles=ROLES, **values
    )


@get("/people")
async def people_page(request: HTMXRequest, plans: deps.Plans) -> Response[Any]:
    return render("console/people.html", await _context(request, plans))


@post("/people")
async def create_person(request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, data: Form) -> Response[Any]:
    try:
        person = await accounts.create(data.username, data.password, data.role, _plan_id(data.plan_id))
    except AppError as exc:
        context = await _context(request, plans, error=exc.message, form=data)
        return render("console/people.html", context, status_code=422)
    return Redirect(f"/admin/people#person-{person.id}", status_code=303)


@post("/people/import")
async def import_people(
    request: HTMXRequest, enrolment: deps.Enrolment, plans: deps.Plans, data: Form
) -> Response[Any]:
    report = await enrolment.import_csv(data.csv)
    return render("console/people.html", await _context(request, plans, report=report), status_code=201)


@post("/people/invite")
async def invite_person(
    request: HTMXRequest, enrolment: deps.Enrolment, plans: deps.Plans, data: Form
) -> Response[Any]:
    try:
        token = await enrolment.invite(data.role, _plan_id(data.plan_id))
    except AppError as exc:
        return render("console/people.html", await _context(request, plans, error=exc.message), status_code=422)
    link = f"{request.base_url}invite/{token}".replace("//invite", "/invite")
    return render("console/people.html", await _context(request, plans, invite=link), status_code=201)


async def _row(request: HTMXRequest, plans: Plans, user_id: int, error: str | None = None) -> Response[Any]:
    """The person's row again for htmx (with the error that refused the change); a plain form gets the page."""
    if not request.htmx:
        if error is None:
            return Redirect(f"/admin/people#person-{user_id}", status_code=303)
        context = await _context(request, plans, row_error=error, error_row=user_id)
        return render("console/people.html", context, status_code=422)
    (row,) = await people_rows(plans, user_id)
    context = page_context(request, "people", row=row, plans=await plans.list(), roles=ROLES, row_error=error)
    return fragment("person-row", context, status_code=422 if error else 200)


@post("/people/{user_id:int}/role")
async def set_role(
    request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, user_id: FromPath[int], data: Form
) -> Response[Any]:
    try:
        await accounts.set_role(user_id, data.role)
    except LastAdmin as exc:
        return await _row(request, plans, user_id, error=exc.message)
    return await _row(request, plans, user_id)


@post("/people/{user_id:int}/suspend")
async def set_suspended(
    request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, user_id: FromPath[int], data: Form
) -> Response[Any]:
    try:
        await accounts.set_suspended(user_id, data.suspended == "1")
    except LastAdmin as exc:
        return await _row(request, plans, user_id, error=exc.message)
    return await _row(request, plans, user_id)


@post("/people/{user_id:int}/plan")
async def set_plan(
    request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, user_id: FromPath[int], data: Form
) -> Response[Any]:
    await accounts.set_plan(user_id, _plan_id(data.plan_id))
    return await _row(request, plans, user_id)


@post("/people/{user_id:int}/password")
async def reset_password(
    request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, user_id: FromPath[int], data: Form
) -> Response[Any]:
    """A new password the admin hands over; the person is signed out everywhere."""
    await accounts.get(user_id)
    try:
        await accounts.set_password(user_id, data.password)
    except AppError as exc:
        return await _row(request, plans, user_id, error=exc.message)
    return await _row(request, plans, user_id)


@post("/people/{user_id:int}/sign-out")
async def sign_out_person(
    request: HTMXRequest,
    accounts: deps.Accounts,
    plans: deps.Plans,
    web_sessions: deps.WebSessions,
    user_id: FromPath[int],
) -> Response[Any]:
    await accounts.get(user_id)
    await web_sessions.end_all(user_id)
    return await _row(request, plans, user_id)


@post("/people/{user_id:int}/delete")
async def delete_person(
    request: HTMXRequest, accounts: deps.Accounts, plans: deps.Plans, user_id: FromPath[int]
) -> Response[Any]:
    """The person gone with their sessions, personal keys, conversations and usage; their history rows stay,
    naming no one (web/people/accounts.py). htmx swaps the row out for nothing."""
    try:
        await accounts.delete(user_id)
    except LastAdmin as exc:
        return await _row(request, plans, user_id, error=exc.message)
    if not request.htmx:
        return Redirect("/admin/people", status_code=303)
    return Response(content="", media_type="text/html", status_code=200)
