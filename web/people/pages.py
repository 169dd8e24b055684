"""The pages a person signs in, up and out with: /login, /signup, /invite/<token>, /logout and /logout-everywhere.
Each form carries a double-submit token (no session exists yet to hold one); a sign-in always starts a new
session id; one message for an unknown name and a wrong password."""

import secrets
from typing import Annotated, Any

from litestar import Request, Response, Router, get, post
from litestar.enums import RequestEncodingType
from litestar.exceptions import HTTPException
from litestar.params import Body, FromPath
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect, Template
from litestar.types import Guard
from msgspec import Struct

from web import deps
from web.config import WebConfig
from web.console.render import PAGE_HEADERS, PRIVATE_HEADERS, error_page
from web.errors import AppError, RateLimited, SignInFailed
from web.people.account import account_page, create_own_key, revoke_own_key
from web.people.accounts import Person
from web.people.guard import EXCEPTION_HANDLERS, SESSION_COOKIE, cookie, session_cookie, signed_in
from web.people.sessions import SessionStore, tokens_match
from web.system.admin_auth import client_address

FORM_COOKIE = "appliance_form"  # the sign-in/up forms' double-submit token
HOME = "/"


class PersonForm(Struct, kw_only=True):
    username: str = ""
    password: str = ""
    csrf_token: str = ""


def form_page(
    request: Request[Any, Any, Any],
    title: str,
    action: str | None,
    *,
    signup_open: bool = False,
    sso: str | None = None,
    error: str | None = None,
    notice: str | None = None,
    username: str = "",
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> Template:
    token = secrets.token_urlsafe(24)
    context = {
        "title": title,
        "action": action,
        "button": title,
        "error": error,
        "notice": notice,
        "username": username,
        "form_token": token,
        "signup_open": signup_open,
        "sso": sso,  # the identity provider's name on the "Sign in with" button; None: no single sign-on
    }
    page = Template(
        "people/form.html", context=context, status_code=status_code, headers={**PRIVATE_HEADERS, **(headers or {})}
    )
    page.cookies.append(cookie(request, FORM_COOKIE, token, 3600, "/"))
    return page


def form_token_ok(request: Request[Any, Any, Any], presented: str) -> bool:
    return tokens_match(request.cookies.get(FORM_COOKIE, ""), presented)


async def start_session(
    request: Request[Any, Any, Any], web_sessions: SessionStore, person: Person, target: str
) -> Response[Any]:
    """Sign in: whatever session id the browser brought ends, a new one is made (no fixation)."""
    await web_sessions.end(request.cookies.get(SESSION_COOKIE))
    session = await web_sessions.create(person.id, client_address(request))
    response = Redirect(target, status_code=303)
    response.cookies.append(session_cookie(request, session))
    response.cookies.append(cookie(request, FORM_COOKIE, "", 0, "/"))
    return response


Form = Annotated[PersonForm, Body(media_type=RequestEncodingType.URL_ENCODED)]
EXPIRED = "The form expired. Please try again."


def sso_name(config: WebConfig) -> str | None:
    return None if config.oidc is None else config.oidc.name


@get("/login")
async def login_page(request: HTMXRequest, enrolment: deps.Enrolment, config: deps.Config) -> Template:
    return form_page(request, "Sign in", "/login", signup_open=enrolment.self_signup, sso=sso_name(config))


@post("/login")
async def login(
    request: HTMXRequest,
    admin: deps.Admin,
    web_sessions: deps.WebSessions,
    enrolment: deps.Enrolment,
    config: deps.Config,
    data: Form,
) -> Response[Any]:
    def again(error: str, status_code: int, **headers: str) -> Template:
        return form_page(
            request,
            "Sign in",
            "/login",
            signup_open=enrolment.self_signup,
            sso=sso_name(config),
            error=error,
            username=data.username[:64],
            status_code=status_code,
            headers=headers,
        )

    if not form_token_ok(request, data.csrf_token):
        return again(EXPIRED, 403)
    try:
        person = await admin.signin.authenticate(data.username, data.password, client_address(request))
    except RateLimited as exc:
        wait = exc.headers["Retry-After"]
        return again(f"Too many failed sign-ins. Try again in {wait} s.", 429, **{"Retry-After": wait})
    except SignInFailed:
        return again("Wrong user name or password.", 401)
    if person.suspended:
        return again("This account is suspended. Ask the administrator.", 403)
    if person.role == "pending":
        return again("Your account waits for the administrator's approval.", 403)
    return await start_session(request, web_sessions, person, HOME)


@post("/logout")
async def logout(request: HTMXRequest, web_sessions: deps.WebSessions) -> Response[Any]:
    await web_sessions.end(signed_in(request).token)
    response = Redirect("/login", status_code=303)
    response.cookies.append(session_cookie(request, None))
    return response


@post("/logout-everywhere")
async def logout_everywhere(request: HTMXRequest, web_sessions: deps.WebSessions) -> Response[Any]:
    """Every session of this person ends, this one too (a forgotten browser in a classroom)."""
    await web_sessions.end_all(signed_in(request).person.id)
    response = Redirect("/login", status_code=303)
    response.cookies.append(session_cookie(request, None))
    return response


@get("/signup")
async def signup_page(request: HTMXRequest, enrolment: deps.Enrolment) -> Template:
    if not enrolment.self_signup:
        return form_page(request, "Sign up", None, error="Sign-up is closed: ask the administrator.", status_code=403)
    return form_page(request, "Sign up", "/signup", signup_open=True)


@post("/signup")
async def signup(request: HTMXRequest, enrolment: deps.Enrolment, data: Form) -> Template:
    if not form_token_ok(request, data.csrf_token):
        return form_page(request, "Sign up", "/signup", signup_open=True, error=EXPIRED, status_code=403)
    try:
        await enrolment.sign_up(data.username, data.password)
    except AppError as exc:
        return form_page(
            request, "Sign up", "/signup", signup_open=True, error=exc.message, status_code=exc.status_code
        )
    return form_page(
        request, "Sign up", None, notice="Thank you. You can sign in once the administrator approves your account."
    )


@get("/invite/{token:str}")
async def invite_page(request: HTMXRequest, enrolment: deps.Enrolment, token: FromPath[str]) -> Template:
    if not await enrolment.invite_is_open(token):
        return form_page(
            request, "Invite", None, error="This invite link is unknown, used or expired.", status_code=404
        )
    return form_page(request, "Create your account", f"/invite/{token}")


@post("/invite/{token:str}")
async def redeem_invite(
    request: HTMXRequest, enrolment: deps.Enrolment, web_sessions: deps.WebSessions, token: FromPath[str], data: Form
) -> Response[Any]:
    action = f"/invite/{token}"
    if not form_token_ok(request, data.csrf_token):
        return form_page(request, "Create your account", action, error=EXPIRED, status_code=403)
    try:
        person = await enrolment.redeem(token, data.username, data.password)
    except AppError as exc:
        return form_page(
            request,
            "Create your account",
            action,
            error=exc.message,
            username=data.username[:64],
            status_code=exc.status_code,
        )
    if not person.may_chat:
        return form_page(request, "Create your account", None, notice="Your account waits for approval.")
    return await start_session(request, web_sessions, person, HOME)


def people_pages(session_guard: Guard) -> list[Router]:
    common: dict[str, Any] = {
        "request_class": HTMXRequest,
        "response_headers": PAGE_HEADERS,
        "include_in_schema": False,
    }
    public = Router(
        path="/", route_handlers=[login_page, login, signup_page, signup, invite_page, redeem_invite], **common
    )
    private = Router(
        path="/",
        route_handlers=[logout, logout_everywhere, account_page, create_own_key, revoke_own_key],
        guards=[session_guard],
        exception_handlers={**EXCEPTION_HANDLERS, AppError: error_page, HTTPException: error_page},
        **common,
    )
    return [public, private]
