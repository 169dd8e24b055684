"""What the security suites share: the app on tests/web's fake engine behind Litestar's synchronous test client,
one app per module (tests/web's async `client` fixture starts an app, migrations included, for every test: too
slow for hundreds of cases), keys in every state, console sign-in, and the figures each test adds to
artifacts/figures/security.json."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from tests.figures import record
from tests.web.conftest import ADMIN, ADMIN_PASSWORD, web_config
from tests.web.fakes import FakeEngineClient
from web.app import Gateway, app_of, build_gateway, create_app
from web.console.auth import LOGIN_COOKIE, SESSION_COOKIE
from web.people.sessions import csrf_of

PERSON_PASSWORD = "a person's long password"

SUITE = "security"
TRIED = "bad inputs tried"
SERVER_ERRORS = "5xx seen (must be 0)"
KNOWN_BUG_ERRORS = "5xx seen on known bugs (strict xfail, BUGS.md)"
AUTH_CASES = "auth cases checked"
KEY_FIELDS = ("id", "name", "revoked_at", "max_tokens_per_request", "quota_tokens", "quota_period", "max_concurrent")
_CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
_LOGIN_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')


def figures(request: pytest.FixtureRequest, values: Mapping[str, int]) -> None:
    """Set this test's figures in artifacts/figures/security.json (see tests/figures.py). A 5xx in a test marked
    xfail (a known bug, BUGS.md) counts apart, so that "5xx seen" says whether anything else broke."""
    known_bug = request.node.get_closest_marker("xfail") is not None
    counted = {KNOWN_BUG_ERRORS if known_bug and k == SERVER_ERRORS else k: v for k, v in values.items()}
    record(SUITE, request.node.nodeid.split("::", 1)[-1], counted)


@dataclass
class Session:
    """A signed-in console: its cookie and the CSRF token its pages carry."""

    cookie: str
    csrf: str


@dataclass
class Appliance:
    """The app on the fake engine, served in-process; requests run on the client's own event loop thread."""

    app: Litestar
    gateway: Gateway
    http: TestClient[Litestar]
    fake: FakeEngineClient
    db_path: Path
    keys: dict[str, str] = field(default_factory=dict)

    def new_key(self, name: str = "security", **limits: Any) -> tuple[int, str]:
        response = self.http.post("/admin/api/keys", json={"name": name, **limits}, headers=ADMIN)
        assert response.status_code == 201, response.text
        body = response.json()
        return int(body["info"]["id"]), str(body["key"])

    def revoke(self, key_id: int) -> None:
        assert self.http.post(f"/admin/api/keys/{key_id}/revoke", headers=ADMIN).status_code == 200

    def key_states(self) -> list[tuple[Any, ...]]:
        """Every key's name, limits and revocation, to show that a refused request changed nothing."""
        listed = self.http.get("/admin/api/keys", headers=ADMIN).json()
        return [tuple(k[f] for f in KEY_FIELDS) for k in listed]

    def sign_in(self, password: str = ADMIN_PASSWORD) -> Session:
        """Sign in through the login form, with its double-submit token, as a browser does."""
        self.http.cookies.clear()
        page = self.http.get("/admin/login")
        token = _LOGIN_TOKEN.search(page.text)
        assert token and LOGIN_COOKIE in page.cookies, page.text
        response = self.http.post(
            "/admin/login",
            data={"username": "admin", "password": password, "csrf_token": token.group(1), "next": "/admin"},
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text
        cookie = response.cookies[SESSION_COOKIE]
        dashboard = self.http.get("/admin")
        self.http.cookies.clear()  # each later request names the cookies it sends
        csrf = _CSRF_META.search(dashboard.text)
        assert csrf, dashboard.text
        return Session(cookie, csrf.group(1))

    def new_person(self, username: str, password: str = PERSON_PASSWORD, **fields: Any) -> int:
        """A person made by the admin (JSON API); returns their id."""
        body = {"username": username, "password": password, **fields}
        response = self.http.post("/admin/api/users", json=body, headers=ADMIN)
        assert response.status_code == 201, response.text
        return int(response.json()["id"])

    def person_signs_in(self, username: str, password: str = PERSON_PASSWORD) -> Session:
        """Sign in at /login as a browser does; the session's CSRF token comes from the session store (the chat
        page carries it)."""
        self.http.cookies.clear()
        page = self.http.get("/login")
        token = _LOGIN_TOKEN.search(page.text)
        assert token, page.text
        response = self.http.post(
            "/login",
            data={"username": username, "password": password, "csrf_token": token.group(1)},
            follow_redirects=False,
        )
        assert response.status_code == 303, response.text
        cookie = response.cookies[SESSION_COOKIE]
        self.http.cookies.clear()
        return Session(cookie, csrf_of(cookie))

    def page(self, session: Session | None, path: str, **headers: str) -> Any:
        """GET a console page as that session (or none), following nothing."""
        self.http.cookies.clear()
        cookie = {"Cookie": f"{SESSION_COOKIE}={session.cookie}"} if session else {}
        return self.http.get(path, headers={**cookie, **headers}, follow_redirects=False)

    def post_form(self, session: Session | None, path: str, form: Mapping[str, str], **headers: str) -> Any:
        self.http.cookies.clear()
        cookie = {"Cookie": f"{SESSION_COOKIE}={session.cookie}"} if session else {}
        return self.http.post(path, data=dict(form), headers={**cookie, **headers}, follow_redirects=False)

    def flush_history(self) -> None:
        self.http.blocking_portal.call(self.gateway.writer.flush)


def route_table() -> Litestar:
    """An app that is never started (its database is never opened): only its route table is read."""
    return create_app(web_config(Path("/nonexistent/route-table.db")), FakeEngineClient())


@contextmanager
def serve(
    tmp_path: Path, fake: FakeEngineClient | None = None, base_url: str = "http://appliance.local", **config: Any
) -> Iterator[Appliance]:
    fake = fake or FakeEngineClient()
    db_path = tmp_path / "appliance.db"
    gateway = build_gateway(web_config(db_path, **config), fake)
    app = app_of(gateway)
    with TestClient(app=app, base_url=base_url, raise_server_exceptions=False, timeout=30) as http:
        deadline = time.monotonic() + 60  # a hung app, not a slow one: these run beside the rest of the suite
        while http.get("/ready").status_code != 200:
            assert time.monotonic() < deadline, "the app never became ready"
            time.sleep(0.01)
        yield Appliance(app, gateway, http, fake, db_path)


@pytest.fixture(scope="module")
def appliance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Appliance]:
    """One app per module (storing prompt and response text), with a user key and a revoked key."""
    with serve(tmp_path_factory.mktemp("security"), store_text=True) as served:
        _, served.keys["user"] = served.new_key("user")
        revoked_id, served.keys["revoked"] = served.new_key("revoked")
        served.revoke(revoked_id)
        yield served


def headers_for(path: str, key: str) -> Mapping[str, str]:
    """The credential an API route takes: a user key for /v1, the admin's Basic credential for the rest."""
    if path.startswith("/v1"):
        return {"Authorization": f"Bearer {key}"}
    if path.startswith(("/admin/api", "/metrics")):
        return ADMIN
    return {}
