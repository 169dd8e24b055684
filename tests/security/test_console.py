"""The console's own defences, over HTTP in-process (tests/browser covers them in a real browser): a CSRF token on
every state-changing route of the route table, the login form's double-submit token, the cookies' flags, session
lifetime across sign-in and logout, the login limit, and no open redirect through ?next=."""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import pytest

from tests.security.conftest import AUTH_CASES, SERVER_ERRORS, TRIED, Appliance, Session, figures, serve
from tests.web.conftest import ADMIN, ADMIN_PASSWORD
from web.console.auth import CSRF_FIELD, CSRF_HEADER, LOGIN_COOKIE, SESSION_COOKIE
from web.people.sessions import MAX_AGE_S
from web.system.login_limiter import LoginLimiter

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}


def console_changes(appliance: Appliance) -> list[tuple[str, str]]:
    """The console's state-changing routes, from the route table (not its JSON API, not the login form)."""
    return sorted(
        (method, route.path)
        for route in appliance.app.routes
        if route.path.startswith("/admin") and not route.path.startswith("/admin/api") and route.path != "/admin/login"
        for method in set(getattr(route, "methods", ())) & STATE_CHANGING
    )


def test_every_state_changing_console_route_needs_the_sessions_csrf_token(
    request: pytest.FixtureRequest, appliance: Appliance
) -> None:
    session, other = appliance.sign_in(), appliance.sign_in()
    key_id, _ = appliance.new_key("csrf target")
    user_id = appliance.new_person("csrf-target")
    plan = appliance.http.post("/admin/api/plans", json={"name": "csrf plan"}, headers=ADMIN)
    plan_id = plan.json()["id"]
    people_before = appliance.http.get("/admin/api/users", headers=ADMIN).json()
    routes = console_changes(appliance)
    assert ("POST", "/admin/keys") in routes and ("POST", "/admin/logout") in routes
    form = {"name": "forged", "quota_period": "none", "max_tokens_per_request": "1"}
    forgeries = {
        "no token": ({}, form),
        "a made-up header": ({CSRF_HEADER: "forged"}, form),
        "a made-up form field": ({}, {**form, CSRF_FIELD: "forged"}),
        "another session's token": ({CSRF_HEADER: other.csrf}, form),
        "another session's token in the form": ({}, {**form, CSRF_FIELD: other.csrf}),
        "the token's prefix": ({CSRF_HEADER: session.csrf[:-1]}, form),
    }
    checked = 0
    for method, template in routes:
        path = _filled(template, key_id, user_id, plan_id)
        for name, (headers, body) in forgeries.items():
            before = appliance.key_states()
            response = appliance.post_form(session, f"{path}?{CSRF_FIELD}={session.csrf}", body, **headers)
            assert response.status_code == 403, f"{method} {path} with {name}: {response.status_code}"
            assert "CSRF" in response.text
            assert appliance.key_states() == before, f"{method} {path} with {name} changed something"
            assert appliance.http.get("/admin/api/users", headers=ADMIN).json() == people_before
            checked += 1
    assert appliance.page(session, "/admin").status_code == 200  # the forged logouts ended nothing
    # The person's deletion last: the routes after it would find no one (404).
    for method, template in sorted(routes, key=lambda route: route[1].endswith("/delete")):
        if template == "/admin/logout":
            continue
        path = _filled(template, key_id, user_id, plan_id)
        response = appliance.post_form(session, path, {**form, "name": "with the token"}, **{CSRF_HEADER: session.csrf})
        # Past the token each route judges its form: the model switch has no model named (its own 409); a person
        # made with no user name or password, and a password reset with none, are refused (422).
        accepted = (409,) if path == "/admin/models/serve" else (201, 303, 422)
        assert response.status_code in accepted, f"{method} {path}: {response.text[:200]}"
    assert appliance.post_form(session, "/admin/logout", {CSRF_FIELD: session.csrf}).status_code == 303
    figures(request, {AUTH_CASES: checked})


def _filled(template: str, key_id: int, user_id: int, plan_id: int) -> str:
    return (
        template.replace("{key_id:int}", str(key_id))
        .replace("{user_id:int}", str(user_id))
        .replace("{plan_id:int}", str(plan_id))
    )


def test_the_login_form_needs_its_own_token(appliance: Appliance) -> None:
    appliance.http.cookies.clear()
    login = {"username": "admin", "password": ADMIN_PASSWORD, "next": "/admin"}
    bare = appliance.http.post("/admin/login", data=login, follow_redirects=False)
    assert bare.status_code == 403 and SESSION_COOKIE not in bare.cookies
    page = appliance.http.get("/admin/login")
    token = page.cookies[LOGIN_COOKIE]
    appliance.http.cookies.clear()
    without_cookie = appliance.http.post("/admin/login", data={**login, CSRF_FIELD: token}, follow_redirects=False)
    assert without_cookie.status_code == 403 and SESSION_COOKIE not in without_cookie.cookies
    mismatched = appliance.http.post(
        "/admin/login",
        data={**login, CSRF_FIELD: "forged"},
        headers={"Cookie": f"{LOGIN_COOKIE}={token}"},
        follow_redirects=False,
    )
    assert mismatched.status_code == 403 and SESSION_COOKIE not in mismatched.cookies


def _set_cookies(response: object) -> dict[str, SimpleCookie]:
    jar: dict[str, SimpleCookie] = {}
    for header in response.headers.get_list("set-cookie"):  # type: ignore[attr-defined]
        cookie: SimpleCookie = SimpleCookie()
        cookie.load(header)
        for name in cookie:
            jar[name] = cookie
    return jar


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_cookie_flags(tmp_path: Path, scheme: str) -> None:
    with serve(tmp_path, base_url=f"{scheme}://appliance.local") as served:
        page = served.http.get("/admin/login")
        token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
        assert token
        signed_in = served.http.post(
            "/admin/login",
            data={"password": ADMIN_PASSWORD, CSRF_FIELD: token.group(1), "next": "/admin"},
            follow_redirects=False,
        )
        csrf = re.search(r'<meta name="csrf-token" content="([^"]+)">', served.http.get("/admin").text)
        assert csrf
        logout = served.http.post("/admin/logout", headers={CSRF_HEADER: csrf.group(1)}, follow_redirects=False)
    secure = scheme == "https"
    login_cookie = _set_cookies(page)[LOGIN_COOKIE][LOGIN_COOKIE]
    session_cookie = _set_cookies(signed_in)[SESSION_COOKIE][SESSION_COOKIE]
    # One session for the chat page and the console (web/people): its cookie is the whole site's.
    for cookie, path in ((login_cookie, "/admin/login"), (session_cookie, "/")):
        assert cookie["httponly"] and cookie["samesite"].lower() == "strict" and cookie["path"] == path
        assert bool(cookie["secure"]) == secure
    assert int(session_cookie["max-age"]) == MAX_AGE_S
    assert int(_set_cookies(signed_in)[LOGIN_COOKIE][LOGIN_COOKIE]["max-age"]) == 0  # the form token is spent
    cleared = _set_cookies(logout)[SESSION_COOKIE][SESSION_COOKIE]
    assert cleared.value == "" and int(cleared["max-age"]) == 0


def test_a_session_id_is_new_at_sign_in_and_dead_after_logout(appliance: Appliance) -> None:
    planted = "attacker-chosen-session-id"
    appliance.http.cookies.clear()
    assert appliance.page(Session(planted, ""), "/admin").status_code == 303  # an unknown id is no session
    session = appliance.sign_in()
    assert session.cookie != planted and len(session.cookie) >= 32
    again = appliance.sign_in()
    assert again.cookie != session.cookie and again.csrf != session.csrf
    assert appliance.page(session, "/admin").status_code == 200  # signing in elsewhere does not end this one
    assert appliance.post_form(session, "/admin/logout", {CSRF_FIELD: session.csrf}).status_code == 303
    replayed = appliance.page(session, "/admin/keys")
    assert replayed.status_code == 303 and replayed.headers["location"].startswith("/admin/login")
    assert appliance.page(again, "/admin").status_code == 200


def test_failed_logins_are_limited(tmp_path: Path) -> None:
    limit = LoginLimiter().limit
    with serve(tmp_path) as served:
        statuses = []
        for attempt in range(limit + 1):
            password = ADMIN_PASSWORD if attempt == limit else "wrong password"
            served.http.cookies.clear()
            token = re.search(r'name="csrf_token" value="([^"]+)"', served.http.get("/admin/login").text)
            assert token
            response = served.http.post(
                "/admin/login", data={"password": password, CSRF_FIELD: token.group(1)}, follow_redirects=False
            )
            statuses.append(response.status_code)
        assert statuses == [401] * limit + [429]  # even the right password, until the window passes
        assert int(response.headers["retry-after"]) >= 1
        assert SESSION_COOKIE not in response.cookies


@pytest.mark.parametrize(
    "target",
    [
        "//evil.example/admin",
        "https://evil.example/admin",
        "/\\evil.example",
        "/admin\\@evil.example",
        "javascript:alert(1)",
        "/admin/../..//evil.example",
        "http:/evil.example",
        "/admin@evil.example",
        "\t//evil.example",
    ],
)
def test_login_never_redirects_off_the_appliance(appliance: Appliance, target: str) -> None:
    """Resolved as a browser resolves Location against the login page: the same scheme and host, whatever ?next=
    said (dot segments may leave /admin, never the appliance)."""
    appliance.http.cookies.clear()
    page = appliance.http.get("/admin/login", params={"next": target})
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token
    response = appliance.http.post(
        "/admin/login",
        data={"password": ADMIN_PASSWORD, CSRF_FIELD: token.group(1), "next": target},
        follow_redirects=False,
    )
    assert response.status_code == 303
    base = "http://appliance.local/admin/login"
    landed = urlsplit(urljoin(base, response.headers["location"]))
    assert (landed.scheme, landed.netloc) == ("http", "appliance.local"), response.headers["location"]


BIG = str(2**63)
OUT_OF_RANGE = {
    "history filtered by key 2**63": ("GET", "/admin/history?key=" + BIG, None),
    "history at offset 2**63": ("GET", "/admin/history?offset=" + BIG, None),
    "export filtered by key 2**63": ("GET", "/admin/history.csv?key=" + BIG, None),
    "history since year 1 east of UTC": ("GET", "/admin/history?since=0001-01-01T00:00%2B01:00", None),
    "history until year 9999 west of UTC": ("GET", "/admin/history?until=9999-12-31T23:59-01:00", None),
    "a key with a quota of 2**63": ("POST", "/admin/keys", {"name": "n", "quota_tokens": BIG}),
    "revoking key 2**63": ("POST", f"/admin/keys/{BIG}/revoke", {}),
}


@pytest.mark.parametrize(("method", "path", "form"), OUT_OF_RANGE.values(), ids=OUT_OF_RANGE.keys())
def test_the_console_refuses_numbers_and_times_out_of_range(
    request: pytest.FixtureRequest, appliance: Appliance, method: str, path: str, form: dict[str, str] | None
) -> None:
    session = appliance.sign_in()
    if method == "GET":
        response = appliance.page(session, path)
    else:
        response = appliance.post_form(session, path, form or {}, **{CSRF_HEADER: session.csrf})
    figures(request, {TRIED: 1, SERVER_ERRORS: int(response.status_code >= 500)})
    assert 400 <= response.status_code < 500 or (method == "GET" and response.status_code == 200)
    assert response.headers["content-type"].startswith("text/html")
