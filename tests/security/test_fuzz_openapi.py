"""schemathesis against every API route of the app in-process (fake engine), with valid credentials: requests that
fit the document must be served or refused as documented (2xx, or 401/403/404/409/429), requests that break it must
get a 4xx; never a 5xx, and every answer has a documented status and shape. The document is the one the app serves
(web/system/openapi.py), with the engine's sampling limits added (tests/security/api_document.py)."""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from litestar import Litestar
from litestar.testing import TestClient
from schemathesis import GenerationMode
from schemathesis.specs.openapi.schemas import OpenApiSchema

from tests.security.api_document import (
    DOCUMENT_PATH,
    fits_context,
    negatable,
    served_document,
    with_engine_limits,
)
from tests.security.conftest import SERVER_ERRORS, TRIED, figures, headers_for, route_table
from tests.web.conftest import ADMIN, web_config
from tests.web.fakes import FakeEngineClient
from web.app import build_gateway, create_app
from web.history.routes import history_router
from web.keys.routes import keys_router
from web.openai.routes import openai_router
from web.system.openapi import generated_document
from web.system.routes import admin_system_router, system_router

EXAMPLES = 50  # per operation and mode: ~5,000 requests over 100 cases, ~200 s of the in-process lane (2 cores)


def is_page(path: str) -> bool:
    """The chat page, the console (its pages and form posts), a person's pages (sign-in, sign-up, invite, account)
    and their static files: not the API."""
    console = path.startswith("/admin") and not path.startswith("/admin/api")
    person = path in ("/login", "/signup", "/logout", "/logout-everywhere") or path.startswith(("/invite/", "/account"))
    return path == "/" or path.startswith("/static/") or console or person


def new_app(db_path: Path) -> Litestar:
    return create_app(web_config(db_path), FakeEngineClient())


APP = route_table()  # each test serves a fresh app
SERVED = served_document()
DOCUMENTS = {
    GenerationMode.POSITIVE: fits_context(SERVED),
    GenerationMode.NEGATIVE: with_engine_limits(SERVED),
}
PATHS = DOCUMENTS[GenerationMode.NEGATIVE]["paths"]
OPERATIONS = [(method.upper(), path) for path, item in PATHS.items() for method in item]
CASES = [
    (method, path, mode)
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode == GenerationMode.POSITIVE or negatable(PATHS[path][method.lower()])
]


def test_every_api_route_is_in_the_document() -> None:
    """A new API route cannot escape the fuzzing: every route that is not a page is an operation here."""
    routes = {
        (method, route.path_format)
        for route in APP.routes
        if not is_page(route.path)
        for method in set(getattr(route, "methods", ())) - {"OPTIONS", "HEAD"}
    }
    assert routes == set(OPERATIONS)


def test_the_app_serves_a_complete_openapi_document(db_path: Path) -> None:
    """To the admin only (it lists the admin API); /v1 bodies, OpenAI's error shape and the real statuses in it.
    Another app on the same settings serves the same document, the one the fuzzer reads (SERVED): so each app
    the fuzzer starts serves it too, unchecked there (generating it costs ~0.6 s, a minute over 100 cases)."""
    with TestClient(app=new_app(db_path)) as http:
        anonymous = http.get(DOCUMENT_PATH)
        ready = time.monotonic() + 60  # a hung app, not a slow one: these run beside the rest of the suite
        while http.get("/ready").status_code != 200:
            assert time.monotonic() < ready, "the app never became ready"
            time.sleep(0.01)
        response = http.get(DOCUMENT_PATH, headers=ADMIN)
    assert anonymous.status_code == 401
    assert response.status_code == 200
    document = response.json()
    assert document == SERVED
    paths, schemas = document["paths"], document["components"]["schemas"]
    chat = paths["/v1/chat/completions"]["post"]
    assert "requestBody" in chat and {"400", "401", "404", "413", "429", "503"} <= chat["responses"].keys()
    refusal = chat["responses"]["400"]["content"]["application/json"]["schema"]["$ref"]
    assert schemas[refusal.rsplit("/", 1)[1]]["required"] == ["error"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]


def test_litestar_alone_documents_the_wrong_error_shape(tmp_path: Path) -> None:
    """Why the document is completed: what Litestar generates says a 400 is {status_code, detail, extra}, while
    the app answers every error in OpenAI's shape (web/errors.py); and it knows no /v1 request body."""

    async def open_door(*_: Any) -> None:
        return None

    routers = [
        openai_router(open_door),
        system_router(open_door),
        admin_system_router(open_door),
        keys_router(open_door),
        history_router(open_door),
    ]
    dependencies = build_gateway(web_config(tmp_path / "appliance.db"), FakeEngineClient()).dependencies()
    generated = generated_document(routers, dependencies)
    samples = generated["paths"]["/admin/api/samples"]["get"]["responses"]["400"]
    assert "status_code" in str(samples)
    assert "requestBody" not in generated["paths"]["/v1/chat/completions"]["post"]


@dataclass
class Target:
    """A fresh app for one operation's run: schemathesis's pytest plugin ends ASGI lifespans after each test."""

    schema: OpenApiSchema
    key: str
    key_id: int

    def new_key_id(self) -> int:
        created = self.schema["/admin/api/keys"]["POST"].Case(body={"name": "target"}).call(headers=ADMIN)
        assert created.status_code == 201, created.text
        return int(created.json()["info"]["id"])


def target_for(mode: GenerationMode, db_path: Path) -> Target:
    schema = schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENTS[mode]))
    schema.app = new_app(db_path)  # schemathesis's ASGI client runs the app's lifespan and its requests in-process
    ready = schema["/ready"]["GET"].Case()
    deadline = time.monotonic() + 60  # a hung app, not a slow one: these run beside the rest of the suite
    while ready.call().status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.01)
    created = schema["/admin/api/keys"]["POST"].Case(body={"name": "fuzz"}).call(headers=ADMIN)
    assert created.status_code == 201, created.text
    return Target(schema, created.json()["key"], created.json()["info"]["id"])


def _integral_floats_to_ints(value: Any) -> Any:
    """JSON Schema cannot tell 5 from 5.0, so a valid request may carry 5.0 for an integer; msgspec refuses it
    (as OpenAI's typed clients never send it)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _integral_floats_to_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral_floats_to_ints(v) for v in value]
    return value


def _steer(case: schemathesis.Case, target: Target, mode: GenerationMode, existing_key: bool) -> None:
    """Reach past the first refusal now and then (valid requests: a key that exists), never touch the key the /v1
    requests use, and leave out what a schema cannot say (5.0 for 5; max_completion_tokens overrides max_tokens
    when both are sent). Invalid requests are left as generated: a change could make them valid."""
    if case.path_parameters and "key_id" in case.path_parameters:
        if existing_key and mode == GenerationMode.POSITIVE:
            case.path_parameters["key_id"] = target.new_key_id()
        assume(case.path_parameters["key_id"] != target.key_id)
    if isinstance(case.body, dict):
        assume(not {"max_tokens", "max_completion_tokens"} <= case.body.keys())
        if mode == GenerationMode.POSITIVE:
            case.body = _integral_floats_to_ints(case.body)


@pytest.mark.usefixtures("cheap_new_passwords")
@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode}" for m, p, mode in CASES])
def test_operation_answers_within_its_document(
    request: pytest.FixtureRequest, db_path: Path, method: str, path: str, mode: GenerationMode
) -> None:
    target = target_for(mode, db_path)
    operation = target.schema[path][method]
    seen = {"tried": 0, "5xx": 0}

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,  # the same cases on every run: a failure here is a finding, never a flake
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), existing_key=st.booleans())
    def run(case: schemathesis.Case, existing_key: bool) -> None:
        _steer(case, target, mode, existing_key)
        seen["tried"] += 1
        response = case.call(headers=dict(headers_for(path, target.key)))
        seen["5xx"] += response.status_code >= 500
        case.validate_response(response)

    try:
        run()
    finally:
        bad = seen["tried"] if mode == GenerationMode.NEGATIVE else 0
        figures(request, {"schemathesis cases": seen["tried"], TRIED: bad, SERVER_ERRORS: seen["5xx"]})
