"""Access control: every route of the app's route table x every credential -> the expected status, and a refused
request changes nothing; secrets stored only hashed; constant-time comparisons; the admin credential's guessing
limit and cross-site use; the development default bind address."""

from __future__ import annotations

import ast
import base64
import inspect
import logging
import secrets
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from appliance import serve as appliance_serve
from appliance.settings import Settings, load_settings
from tests.security.conftest import AUTH_CASES, Appliance, Session, figures, route_table, serve
from tests.web.conftest import ADMIN, ADMIN_PASSWORD, METRICS_TOKEN, MODEL, assert_openai_error, web_config
from web.console.auth import CSRF_HEADER, SESSION_COOKIE
from web.keys.service import KeyService, hash_key
from web.people.sessions import SessionStore, tokens_match
from web.people.signin import SignIn
from web.static import STATIC_DIR
from web.system.admin_auth import AdminAuth, verify_password
from web.system.login_limiter import LoginLimiter

REPO = Path(__file__).resolve().parents[2]
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
ROUTE_TABLE = route_table().routes


def _static_file(folder: str) -> str:
    files = sorted(p.name for p in (STATIC_DIR / folder).iterdir() if not p.name.startswith("."))
    return files[0] if files else "missing.js"


# -- who may call what -------------------------------------------------------------------------------------------

API_KEY, ADMIN_ONLY, METRICS, PUBLIC, CONSOLE, LOGIN_FORM, PERSON = (
    "user key",
    "admin credential",
    "admin credential or metrics token",
    "anyone",
    "console session",
    "anyone with the login form's token",
    "a person's session",
)
KEY_OR_SESSION = "user key, or a person's session with its CSRF header"  # what the chat page calls
PERSON_API = "a person's session, with its CSRF header on changes"  # the chat page's saved conversations
PERSON_PATHS = ("/logout", "/logout-everywhere", "/account", "/account/keys", "/account/keys/{key_id:int}/revoke")


def policy(path: str) -> str:
    """Who may call a route, by where it lives. A route in no known place fails the matrix: decide, then add it."""
    if path == "/api/version":  # open, as Ollama's (clients probe it first); it says nothing of the models
        return PUBLIC
    if path in ("/v1/chat/completions", "/v1/models"):
        return KEY_OR_SESSION
    if path == "/api/conversations" or path.startswith("/api/conversations/"):
        return PERSON_API
    if path.startswith(("/v1/", "/api/")):
        return API_KEY
    if path.startswith("/admin/api/"):
        return ADMIN_ONLY
    if path == "/metrics":
        return METRICS
    if path in ("/", "/health", "/ready") or path.startswith("/static/"):
        return PUBLIC
    if path in ("/admin/login", "/login", "/signup", "/invite/{token:str}"):
        return LOGIN_FORM
    if path in PERSON_PATHS:
        return PERSON
    if path == "/admin" or path.startswith("/admin/"):
        return CONSOLE
    raise AssertionError(f"{path} has no access policy in the matrix")


@dataclass(frozen=True)
class Call:
    """A request that the route serves when its credential is right, and the status it then answers."""

    status: int
    json: Any = None
    form: dict[str, str] | None = None
    params: dict[str, str] | None = None
    signed_in: int | None = None  # the status for a console session, where it differs


# One entry per route and method of the app. A route missing here fails test_the_matrix_covers_every_route.
ALLOWED: dict[tuple[str, str], Call] = {
    ("POST", "/v1/chat/completions"): Call(200, json=CHAT),
    ("POST", "/v1/completions"): Call(200, json={"model": MODEL, "prompt": "hi"}),
    ("GET", "/v1/models"): Call(200),
    ("POST", "/v1/messages"): Call(200, json={**CHAT, "max_tokens": 4}),
    ("POST", "/v1/messages/count_tokens"): Call(200, json=CHAT),
    ("GET", "/v1/models/{model_id:path}"): Call(200),
    ("POST", "/v1/responses"): Call(200, json={"model": MODEL, "input": "hi", "max_output_tokens": 4}),
    # No stored response has this id: past the guard, a 404 (test_a_stored_response_is_its_keys_alone has the 200s).
    ("GET", "/v1/responses/{response_id:str}"): Call(404),
    ("DELETE", "/v1/responses/{response_id:str}"): Call(404),
    # The app on the fake engine has no embedding model: past the guard, the 404 that names the setting.
    ("POST", "/v1/embeddings"): Call(404, json={"model": "all-MiniLM-L6-v2", "input": "hi"}),
    ("GET", "/api/version"): Call(200),
    ("GET", "/api/tags"): Call(200),
    ("GET", "/api/ps"): Call(200),
    ("POST", "/api/show"): Call(200, json={"model": MODEL}),
    ("POST", "/api/chat"): Call(200, json={**CHAT, "stream": False}),
    ("POST", "/api/generate"): Call(200, json={"model": MODEL, "prompt": "hi", "stream": False}),
    ("POST", "/api/embed"): Call(404, json={"model": "all-MiniLM-L6-v2", "input": "hi"}),
    ("POST", "/api/embeddings"): Call(404, json={"model": "all-MiniLM-L6-v2", "prompt": "hi"}),
    **{("POST", f"/api/{name}"): Call(403, json={"model": MODEL}) for name in ("pull", "push", "create", "copy")},
    ("DELETE", "/api/delete"): Call(403),  # the operator manages the models
    # The fake engine has no tokenizer files to publish: past the guard, a 404 (tests/backends has the 200s).
    ("GET", "/v1/tokenizer"): Call(404, params={"model": MODEL}),
    ("GET", "/health"): Call(200),
    ("GET", "/ready"): Call(200),
    ("GET", "/metrics"): Call(200),
    ("GET", "/admin/api/stats"): Call(200),
    ("GET", "/admin/api/samples"): Call(200),
    ("GET", "/admin/api/keys"): Call(200),
    ("POST", "/admin/api/keys"): Call(201, json={"name": "made in the matrix"}),
    ("GET", "/admin/api/keys/{key_id:int}"): Call(200),
    ("PATCH", "/admin/api/keys/{key_id:int}"): Call(200, json={"quota_tokens": 10}),
    ("DELETE", "/admin/api/keys/{key_id:int}"): Call(204),
    ("POST", "/admin/api/keys/{key_id:int}/revoke"): Call(200),
    ("GET", "/admin/api/keys/{key_id:int}/end-users"): Call(200),
    ("GET", "/admin/api/requests"): Call(200),
    ("GET", "/admin/api/backends"): Call(200),
    ("GET", "/admin/api/requests/{request_id:str}"): Call(200),
    ("GET", "/admin/api/openapi.json"): Call(200),  # admin-only: it lists the admin API
    ("GET", "/admin/api/users"): Call(200),
    ("POST", "/admin/api/users"): Call(400, json={"username": "matrix", "password": "short"}),  # past the guard
    ("POST", "/admin/api/users/import"): Call(200, json={"csv": "username,password\n"}),
    ("GET", "/admin/api/users/{user_id:int}"): Call(200),
    ("PATCH", "/admin/api/users/{user_id:int}"): Call(200, json={}),
    ("DELETE", "/admin/api/users/{user_id:int}"): Call(204),
    ("POST", "/admin/api/users/{user_id:int}/sign-out"): Call(200),
    ("POST", "/admin/api/invites"): Call(201, json={}),
    ("DELETE", "/admin/api/users/{user_id:int}/conversations"): Call(200),
    ("GET", "/api/conversations"): Call(200),
    ("POST", "/api/conversations"): Call(201, json={}),
    ("DELETE", "/api/conversations"): Call(200),
    # No conversation of the session's person has this id: past the guard, a 404 (test_conversations_isolation).
    ("GET", "/api/conversations/{conversation_id:str}"): Call(404),
    ("PATCH", "/api/conversations/{conversation_id:str}"): Call(404, json={}),
    ("PUT", "/api/conversations/{conversation_id:str}/messages"): Call(404, json={"messages": []}),
    ("DELETE", "/api/conversations/{conversation_id:str}"): Call(404),
    ("GET", "/login"): Call(200),
    ("POST", "/login"): Call(403, form={"username": "admin", "password": ADMIN_PASSWORD}),  # no form token
    ("GET", "/signup"): Call(403),  # closed unless the operator opens it
    ("POST", "/signup"): Call(403, form={"username": "x", "password": ADMIN_PASSWORD}),
    ("GET", "/invite/{token:str}"): Call(404),  # no such invite
    ("POST", "/invite/{token:str}"): Call(403, form={"username": "x", "password": ADMIN_PASSWORD}),
    ("GET", "/admin/api/plans"): Call(200),
    ("POST", "/admin/api/plans"): Call(400, json={"name": "matrix", "weight": -1}),  # past the guard: refused
    ("GET", "/admin/api/plans/{plan_id:int}"): Call(404),  # no such plan
    ("PATCH", "/admin/api/plans/{plan_id:int}"): Call(404, json={}),
    ("GET", "/account"): Call(200),
    ("POST", "/account/keys"): Call(201, form={"name": "matrix"}),
    # The target key is the admin's, not the session's person's: past the guard, the same 404 as no key at all.
    ("POST", "/account/keys/{key_id:int}/revoke"): Call(404),
    ("POST", "/logout"): Call(303),
    ("POST", "/logout-everywhere"): Call(303),
    ("GET", "/"): Call(200),
    ("GET", "/admin/login"): Call(200, signed_in=303),  # a signed-in admin is sent on to the console
    ("POST", "/admin/login"): Call(403, form={"password": ADMIN_PASSWORD}),  # without the form's token: refused
    ("POST", "/admin/logout"): Call(303),
    ("GET", "/admin"): Call(200),
    ("GET", "/admin/history"): Call(200),
    ("GET", "/admin/history/{request_id:str}"): Call(200),
    ("GET", "/admin/history.csv"): Call(200),
    ("GET", "/admin/keys"): Call(200),
    ("POST", "/admin/keys"): Call(201, form={"name": "made in the matrix"}),
    ("GET", "/admin/keys/{key_id:int}"): Call(303),  # a plain visit goes to the keys page; htmx gets the card
    ("POST", "/admin/keys/{key_id:int}"): Call(303, form={"name": "renamed", "quota_period": "none"}),
    ("GET", "/admin/keys/{key_id:int}/edit"): Call(303),
    ("GET", "/admin/keys/{key_id:int}/end-users"): Call(200),
    ("POST", "/admin/keys/{key_id:int}/revoke"): Call(303),
    ("GET", "/admin/models"): Call(200),
    ("POST", "/admin/models/serve"): Call(409, form={"model": "no-such-model"}),  # refused, nothing switched
    ("GET", "/admin/people"): Call(200),
    ("POST", "/admin/people"): Call(422, form={"username": "matrix"}),  # no password: refused past the guard
    ("POST", "/admin/people/import"): Call(201, form={"csv": "username,password\n"}),
    ("POST", "/admin/people/invite"): Call(201, form={"role": "user"}),
    ("POST", "/admin/people/{user_id:int}/role"): Call(303, form={"role": "user"}),
    ("POST", "/admin/people/{user_id:int}/suspend"): Call(303, form={"suspended": "0"}),
    ("POST", "/admin/people/{user_id:int}/plan"): Call(303, form={"plan_id": ""}),
    ("POST", "/admin/people/{user_id:int}/password"): Call(303, form={"password": "a long new password"}),
    ("POST", "/admin/people/{user_id:int}/sign-out"): Call(303),
    ("POST", "/admin/people/{user_id:int}/delete"): Call(303),  # the matrix's own target person, made per test
    ("GET", "/admin/plans"): Call(200),
    ("POST", "/admin/plans"): Call(422, form={"name": ""}),  # no name: refused past the guard
    ("POST", "/admin/plans/{plan_id:int}"): Call(404, form={"name": "x"}),  # no such plan
    **{("GET", f"/static/{d}/{{file_path:path}}"): Call(200) for d in ("css", "js", "vendor")},
    **{("HEAD", f"/static/{d}/{{file_path:path}}"): Call(200) for d in ("css", "js", "vendor")},
}
ROUTES = sorted((m, r.path) for r in ROUTE_TABLE for m in getattr(r, "methods", ()) if m != "OPTIONS")


@dataclass
class Credential:
    name: str
    headers: Callable[[Appliance, Session], dict[str, str]]
    opens: set[str] = field(default_factory=set)  # the policies it satisfies (besides PUBLIC and LOGIN_FORM)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


CREDENTIALS = [
    Credential("no credential", lambda a, s: {}),
    Credential("malformed: empty bearer", lambda a, s: {"Authorization": "Bearer "}),
    Credential("malformed: not base64", lambda a, s: {"Authorization": "Basic %%%not-base64%%%"}),
    Credential("malformed: unknown scheme", lambda a, s: {"Authorization": "Token abc"}),
    Credential("unknown key", lambda a, s: _bearer("sk-" + secrets.token_urlsafe(32))),
    Credential("revoked key", lambda a, s: _bearer(a.keys["revoked"])),
    Credential("user key", lambda a, s: _bearer(a.keys["user"]), {API_KEY, KEY_OR_SESSION}),
    Credential("metrics token", lambda a, s: _bearer(METRICS_TOKEN), {METRICS}),
    Credential("admin Basic", lambda a, s: dict(ADMIN), {ADMIN_ONLY, METRICS}),
    Credential(
        "admin session",
        lambda a, s: {"Cookie": f"{SESSION_COOKIE}={s.cookie}", CSRF_HEADER: s.csrf},
        {CONSOLE, PERSON, KEY_OR_SESSION, PERSON_API},
    ),
    Credential("person session", lambda a, s: _person_session(a), {PERSON, KEY_OR_SESSION, PERSON_API}),
]


def _person_session(appliance: Appliance) -> dict[str, str]:
    """A fresh session of a plain person (the allowed call may end it): no admin."""
    if "matrix-person" not in appliance.keys:
        appliance.new_person("matrix-person")
        appliance.keys["matrix-person"] = "made"
    signed = appliance.person_signs_in("matrix-person")
    return {"Cookie": f"{SESSION_COOKIE}={signed.cookie}", CSRF_HEADER: signed.csrf}


def test_the_matrix_covers_every_route() -> None:
    """Every route and method the app serves has an entry; a new route cannot escape the matrix."""
    assert {(m, p) for m, p in ROUTES} == set(ALLOWED)
    for _, path in ROUTES:
        policy(path)


@dataclass
class Fixtures:
    """What path parameters point at: a key made for the test (changed or deleted by it), a real request."""

    request_id: str
    key_id: int
    user_id: int


def _path(template: str, fixtures: Fixtures) -> str:
    folder = template.split("/")[2] if template.startswith("/static/") else ""
    return (
        template.replace("{model_id:path}", MODEL)
        .replace("{key_id:int}", str(fixtures.key_id))
        .replace("{request_id:str}", fixtures.request_id)
        .replace("{user_id:int}", str(fixtures.user_id))
        .replace("{plan_id:int}", "999999")
        .replace("{token:str}", "no-such-invite")
        .replace("{conversation_id:str}", "no-such-conversation")
        .replace("{file_path:path}", _static_file(folder) if folder else "")
    )


def _send(appliance: Appliance, method: str, path: str, call: Call, headers: dict[str, str]) -> Any:
    appliance.http.cookies.clear()  # each request carries only the credential under test
    kwargs: dict[str, Any] = {"headers": headers, "follow_redirects": False}
    if call.json is not None:
        kwargs["json"] = call.json
    if call.form is not None:
        kwargs["data"] = call.form
    if call.params is not None:
        kwargs["params"] = call.params
    return appliance.http.request(method, path, **kwargs)


def _assert_refused(response: Any, rule: str, credential: Credential, path: str) -> None:
    where = f"{credential.name} on {path}"
    if rule == CONSOLE:
        assert response.status_code == 303, where
        assert response.headers["location"].startswith("/admin/login?next="), where
    elif rule == PERSON:
        assert response.status_code == 303, where
        assert response.headers["location"].startswith("/login?next="), where
    elif rule == PERSON_API:  # under /api/, but the app's own shape (not Ollama's)
        assert_openai_error(response, 401)
    elif path.startswith("/v1/messages"):  # the Anthropic API's own error shape
        assert response.status_code == 401, where
        assert response.json()["error"]["type"] == "authentication_error", where
    elif path.startswith("/api/"):  # Ollama's: {"error": "..."}
        assert response.status_code == 401, where
        assert set(response.json()) == {"error"} and "API key" in response.json()["error"], where
    else:
        assert_openai_error(response, 401)
        if rule in (ADMIN_ONLY, METRICS):
            assert response.headers["www-authenticate"].startswith("Basic"), where


@pytest.fixture
def session(appliance: Appliance) -> Session:
    """Per test: /logout-everywhere ends every session of the admin."""
    return appliance.sign_in()


@pytest.mark.parametrize(("method", "path"), ROUTES, ids=[f"{m} {p}" for m, p in ROUTES])
def test_route_answers_each_credential_as_its_policy_says(
    request: pytest.FixtureRequest, appliance: Appliance, session: Session, method: str, path: str
) -> None:
    rule, call = policy(path), ALLOWED[(method, path)]
    chat = appliance.http.post("/v1/chat/completions", json=CHAT, headers=_bearer(appliance.keys["user"]))
    key_id, _ = appliance.new_key("matrix target")
    user_id = appliance.new_person(f"target-{secrets.token_hex(4)}")
    fixtures = Fixtures(chat.json()["id"], key_id, user_id)
    url = _path(path, fixtures)
    allowed = [c for c in CREDENTIALS if rule in (PUBLIC, LOGIN_FORM) or rule in c.opens]
    for credential in (c for c in CREDENTIALS if c not in allowed):  # first: each must find the target as it was
        before = appliance.key_states()
        response = _send(appliance, method, url, call, credential.headers(appliance, session))
        _assert_refused(response, rule, credential, path)
        assert appliance.key_states() == before, f"{credential.name} changed something through {method} {path}"
    for credential in allowed:
        response = _send(appliance, method, url, call, credential.headers(appliance, session))
        expected = call.signed_in if call.signed_in and CONSOLE in credential.opens else call.status
        assert response.status_code == expected, f"{credential.name}: {response.text[:300]}"
    checked = len(CREDENTIALS)
    figures(request, {AUTH_CASES: checked})


@pytest.mark.parametrize("path", sorted({p for _, p in ROUTES}))
def test_options_reveal_nothing(request: pytest.FixtureRequest, appliance: Appliance, path: str) -> None:
    """Litestar answers OPTIONS itself (Allow header, empty body); behind a router's guard it is refused like the
    route. Either way no credential is needed to learn nothing."""
    url = _path(path, Fixtures("none", 1, 1))
    appliance.http.cookies.clear()
    response = appliance.http.options(url, follow_redirects=False)
    figures(request, {AUTH_CASES: 1})
    assert response.status_code in (204, 303, 401), response.text
    if response.status_code == 204:
        assert response.content == b"" and "allow" in response.headers
    if response.status_code != 204:
        assert policy(path) not in (PUBLIC, LOGIN_FORM)


def test_a_stored_response_is_its_keys_alone(request: pytest.FixtureRequest, appliance: Appliance) -> None:
    """A response (the appliance stores text) is read, continued and deleted by the key that created it; to any
    other key it does not exist, and its refusals leave it there."""
    _, other = appliance.new_key("other")
    mine, theirs = _bearer(appliance.keys["user"]), _bearer(other)
    body = {"model": MODEL, "input": "my secret", "max_output_tokens": 4}
    created = appliance.http.post("/v1/responses", json=body, headers=mine)
    assert created.status_code == 200, created.text
    rid, path = created.json()["id"], f"/v1/responses/{created.json()['id']}"
    refused = [
        appliance.http.get(path, headers=theirs),
        appliance.http.delete(path, headers=theirs),
        appliance.http.post("/v1/responses", json={**body, "previous_response_id": rid}, headers=theirs),
    ]
    figures(request, {AUTH_CASES: len(refused)})
    assert_openai_error(refused[0], 404, param="response_id")
    assert_openai_error(refused[1], 404, param="response_id")
    assert_openai_error(refused[2], 400, "previous_response_not_found", "previous_response_id")
    assert all("my secret" not in r.text for r in refused)
    assert appliance.http.get(path, headers=mine).json() == created.json()
    continued = appliance.http.post("/v1/responses", json={**body, "previous_response_id": rid}, headers=mine)
    assert continued.status_code == 200 and continued.json()["previous_response_id"] == rid
    assert appliance.http.delete(path, headers=mine).json()["deleted"] is True
    assert_openai_error(appliance.http.get(path, headers=mine), 404)


def test_pages_are_public_and_the_console_sends_to_its_login(appliance: Appliance) -> None:
    appliance.http.cookies.clear()
    assert appliance.http.get("/").status_code == 200
    plain = appliance.http.get("/admin/keys?x=1", follow_redirects=False)
    assert plain.status_code == 303 and plain.headers["location"] == "/admin/login?next=%2Fadmin%2Fkeys%3Fx%3D1"
    htmx = appliance.http.get("/admin", headers={"HX-Request": "true"}, follow_redirects=False)
    assert htmx.status_code == 401 and htmx.headers["hx-redirect"] == "/admin/login"
    login = appliance.http.get("/admin/login")
    assert login.status_code == 200 and 'name="password"' in login.text
    basic = appliance.http.get("/admin", headers=ADMIN, follow_redirects=False)
    assert basic.status_code == 303  # the console takes only its own session, not the API's Basic credential


# -- secrets at rest ---------------------------------------------------------------------------------------------


def test_keys_and_passwords_exist_only_hashed_in_the_database(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    new_password = "a-second-admin-password"
    caplog.set_level(logging.DEBUG)
    with serve(tmp_path, store_text=True) as served:
        key_id, key = served.new_key("stored")
        for body in (CHAT, {**CHAT, "model": "unknown"}, {**CHAT, "messages": []}):
            served.http.post("/v1/chat/completions", json=body, headers=_bearer(key))
        served.http.get("/v1/models", headers={"Authorization": f"Bearer {key}x"})
        served.revoke(key_id)
        served.http.get("/v1/models", headers=_bearer(key))
        served.http.blocking_portal.call(served.gateway.admin.set_password, new_password)
        new_basic = "Basic " + base64.b64encode(f"admin:{new_password}".encode()).decode()
        assert served.http.get("/admin/api/keys", headers={"Authorization": new_basic}).status_code == 200
        served.sign_in(new_password)
        served.flush_history()
        files = sorted(tmp_path.glob("appliance.db*"))
        while_running = b"".join(p.read_bytes() for p in files)
    after_stop = b"".join(p.read_bytes() for p in sorted(tmp_path.glob("appliance.db*")))
    secrets_in_plain = {
        "the API key": key,
        "the seeded admin password": ADMIN_PASSWORD,
        "the new admin password": new_password,
        "the metrics token": METRICS_TOKEN,
        "a Basic credential": new_basic.split()[1],
    }
    assert len(files) >= 1
    for name, secret in secrets_in_plain.items():
        for encoding in ("utf-8", "utf-16-le"):
            assert secret.encode(encoding) not in while_running + after_stop, f"{name} is in the database"
        assert secret not in caplog.text, f"{name} is in the log"
    assert hash_key(key).encode() in while_running + after_stop  # what is stored instead
    assert b"scrypt$" in while_running + after_stop


def test_secret_settings_stay_out_of_reprs() -> None:
    settings = Settings(admin_password="pw-in-settings", metrics_token="token-in-settings")
    config = web_config(Path("/tmp/x.db"), admin_password="pw-in-config", metrics_token="token-in-config")
    assert "pw-in-settings" not in repr(settings) and "token-in-settings" not in repr(settings)
    assert "pw-in-config" not in repr(config) and "token-in-config" not in repr(config)


# -- constant-time comparison ------------------------------------------------------------------------------------

SECRET_NAMES = ("key", "token", "password", "digest", "hash", "secret", "presented", "credential", "memo")
CONSTANT_TIME = ("hmac.compare_digest", "secrets.compare_digest")


def _compared_names(function: Callable[..., Any]) -> list[str]:
    """Names and attributes that appear in an == / != comparison inside the function."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops):
            for operand in (node.left, *node.comparators):
                for sub in ast.walk(operand):
                    if isinstance(sub, ast.Name):
                        found.append(sub.id)
                    elif isinstance(sub, ast.Attribute):
                        found.append(sub.attr)
    return found


@pytest.mark.parametrize(
    "function",
    [KeyService.authenticate, verify_password, SignIn._rehash, AdminAuth.check_metrics, tokens_match],
    ids=lambda f: f.__qualname__,
)
def test_secrets_are_compared_in_constant_time(function: Callable[..., Any]) -> None:
    """Checked by reading the code, not by timing it: a difference of a few nanoseconds per byte drowns in the
    noise of a shared CI machine, so a timing test would either flake or prove nothing. What makes comparison
    constant-time is the code path: hmac.compare_digest (secrets.compare_digest is the same function), or
    looking a key up by its hash, so that what the timing could leak is a hash, not the key. And no secret may
    meet == or !=, which stop at the first differing byte."""
    source = inspect.getsource(function)
    assert any(name in source for name in CONSTANT_TIME), f"{function.__qualname__} uses no compare_digest"
    leaky = [n for n in _compared_names(function) if any(word in n.lower() for word in SECRET_NAMES)]
    assert not leaky, f"{function.__qualname__} compares {leaky} with == or !="


def test_sessions_are_found_by_their_hash() -> None:
    """Like API keys: the cookie's value is hashed before the database is asked, and the row found by that hash."""
    source = inspect.getsource(SessionStore.get)
    assert source.index("_digest(token)") < source.index("execute(")
    assert "WebSession.id_hash == digest" in source


def test_api_keys_are_found_by_their_hash() -> None:
    """The key is hashed before the database is asked, and the row is selected by that hash."""
    source = inspect.getsource(KeyService.authenticate)
    assert source.index("hash_key(presented)") < source.index("execute(")
    from web.keys import service

    assert "key_hash == bindparam" in inspect.getsource(service).replace("__table__.c.", "").replace("ApiKey.", "")


# -- the admin credential ----------------------------------------------------------------------------------------


def test_guessing_the_admin_password_over_basic_auth_is_limited(tmp_path: Path) -> None:
    limit = LoginLimiter().limit
    wrong = {"Authorization": "Basic " + base64.b64encode(b"admin:not-the-password").decode()}
    with serve(tmp_path) as served:
        statuses = [served.http.get("/admin/api/keys", headers=wrong).status_code for _ in range(limit + 2)]
    assert statuses[:limit] == [401] * limit
    assert statuses[limit:] == [429, 429]


def test_admin_api_refuses_cross_site_requests_carrying_browser_credentials(appliance: Appliance) -> None:
    """A browser that once answered the API's Basic prompt sends that credential with every later request to the
    appliance, also one a foreign page makes it send: a form post needs no CORS preflight."""
    key_id, key = appliance.new_key("cross-site target")
    cross_site = {
        **ADMIN,
        "Origin": "http://evil.example",
        "Sec-Fetch-Site": "cross-site",
        "Content-Type": "application/x-www-form-urlencoded",
    }
    response = appliance.http.post(f"/admin/api/keys/{key_id}/revoke", headers=cross_site, content=b"")
    assert 400 <= response.status_code < 500
    assert appliance.http.get("/v1/models", headers=_bearer(key)).status_code == 200


# -- the bind address --------------------------------------------------------------------------------------------


def test_the_development_default_binds_loopback_only() -> None:
    """The settings' default is loopback and serve() binds what the settings say (a real server started without
    APPLIANCE_HOST listens on 127.0.0.1 only: test_engine_boundary.py); the LAN takes an explicit setting, which
    the installer writes into the service's env file."""
    assert Settings().host == "127.0.0.1"
    assert load_settings({}).host == "127.0.0.1"
    assert load_settings({"APPLIANCE_HOST": "0.0.0.0"}).host == "0.0.0.0"
    assert "host=settings.host" in inspect.getsource(appliance_serve.serve)
    unit = (REPO / "systemd" / "appliance.service").read_text()
    assert "APPLIANCE_HOST" not in unit and "--host" not in unit
    example = (REPO / "systemd" / "appliance.env.example").read_text()
    assert "APPLIANCE_HOST=0.0.0.0" in example.splitlines()
