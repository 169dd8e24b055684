"""/auth/oidc/login sends the browser to the identity provider with a new flow's state, nonce and PKCE challenge
(kept in a short-lived cookie); /auth/oidc/callback checks the answer, finds or makes the person and starts the
same kind of session the password sign-in starts. Every failure is the sign-in page with its reason, and no
session."""

from typing import Any

from litestar import Request, Response, Router, get
from litestar.datastructures import Cookie
from litestar.plugins.htmx import HTMXRequest
from litestar.response import Redirect, Template

from web import deps
from web.console.render import PAGE_HEADERS, PRIVATE_HEADERS
from web.people.guard import SESSION_COOKIE, session_cookie
from web.people.oidc.flow import Flow, SignOnFailed
from web.people.pages import form_page
from web.system.admin_auth import client_address

FLOW_COOKIE = "appliance_oidc_flow"
FLOW_PATH = "/auth/oidc/"
FLOW_MAX_AGE_S = 600  # ten minutes to sign in at the provider
CALLBACK = "/auth/oidc/callback"
HOME = "/"


def flow_cookie(request: Request[Any, Any, Any], flow: Flow | None) -> Cookie:
    """SameSite=Lax, unlike the session's Strict: the provider's redirect back is a navigation from another site,
    on which a Strict cookie is not sent."""
    return Cookie(
        key=FLOW_COOKIE,
        value=flow.cookie_value() if flow else "",
        max_age=FLOW_MAX_AGE_S if flow else 0,
        path=FLOW_PATH,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
    )


def redirect_uri(request: Request[Any, Any, Any], sso: deps.SingleSignOn) -> str:
    return sso.config.redirect_url or str(request.url.with_replacements(path=CALLBACK, query=""))


def refused(request: Request[Any, Any, Any], sso: deps.SingleSignOn, reason: str, status_code: int) -> Template:
    page = form_page(
        request, "Sign in", "/login", error=f"Single sign-on failed: {reason}.", sso=sso.config.name,
        status_code=status_code,
    )  # fmt: skip
    page.cookies.append(flow_cookie(request, None))
    return page


@get("/login")
async def oidc_login(request: HTMXRequest, sso: deps.SingleSignOn) -> Response[Any]:
    flow = Flow.new()
    try:
        url = await sso.client.authorization_url(flow, redirect_uri(request, sso))
    except SignOnFailed as exc:
        return refused(request, sso, str(exc), 502)
    response = Redirect(url, status_code=303)
    response.cookies.append(flow_cookie(request, flow))
    return response


@get("/callback")
async def oidc_callback(request: HTMXRequest, sso: deps.SingleSignOn, web_sessions: deps.WebSessions) -> Response[Any]:
    query = request.query_params
    flow = Flow.of_cookie(request.cookies.get(FLOW_COOKIE))
    if flow is None or not flow.state_matches(query.get("state")):
        return refused(request, sso, "this sign-in was not started here, or took too long; please start again", 400)
    if query.get("error"):
        return refused(request, sso, f"the identity provider answered {query['error'][:64]!r}", 403)
    try:
        claims = await sso.client.claims(flow, redirect_uri(request, sso), query.get("code", ""), query.get("iss"))
        person = await sso.identities.sign_in(claims)
    except SignOnFailed as exc:
        return refused(request, sso, str(exc), 403)
    if person.suspended:
        return refused(request, sso, "this account is suspended; ask the administrator", 403)
    if not person.may_chat:
        return refused(request, sso, "your account waits for the administrator's approval", 403)
    await web_sessions.end(request.cookies.get(SESSION_COOKIE))  # no fixation: always a new session id
    session = await web_sessions.create(person.id, client_address(request))
    # A page, not a redirect: a redirect chain that began at the provider's site is cross-site, and the browser
    # would not send the new SameSite=Strict session cookie with it; this page's own navigation is same-site.
    page = Template("people/signed_in.html", context={"target": HOME}, headers=PRIVATE_HEADERS)
    page.cookies.extend([session_cookie(request, session), flow_cookie(request, None)])
    return page


def oidc_router() -> Router:
    return Router(
        path="/auth/oidc",
        route_handlers=[oidc_login, oidc_callback],
        request_class=HTMXRequest,
        response_headers=PAGE_HEADERS,
        include_in_schema=False,
    )
