"""schemathesis against every API route of the app in-process (fake engine), with valid credentials: requests that
fit the document must be served or refused as documented (2xx, or 401/403/404/409/429), requests that break it must
get a 4xx; never a 5xx, and every answer has a documented status and shape. The document is the app's route table
as Litestar generates it, completed where it is silent or wrong (BUGS.md B1; tests/security/api_document.py)."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
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
    FITS_CONTEXT,
    INT64_MAX,
    INT64_MIN,
    SERVER_LIMITS,
    UINT64_MAX,
    completed_document,
    generated_document,
    negatable,
)
from tests.security.conftest import SERVER_ERRORS, TRIED, figures, headers_for, route_table
from tests.web.conftest import ADMIN, MODEL, web_config
from tests.web.fakes import VOCAB, FakeEngineClient
from web.app import create_app

EXAMPLES = 50  # per operation and mode: ~1,000 requests, ~20 s on two shared cores


def is_page(path: str) -> bool:
    """The chat page, the console (its pages and form posts) and their static files: not the API."""
    console = path.startswith("/admin") and not path.startswith("/admin/api")
    return path == "/" or path.startswith("/static/") or console


def new_app(directory: Path) -> Litestar:
    return create_app(web_config(directory / "appliance.db"), FakeEngineClient())


APP = route_table()  # each test serves a fresh app
DOCUMENTS = {
    GenerationMode.POSITIVE: completed_document(APP, MODEL, VOCAB, FITS_CONTEXT),
    GenerationMode.NEGATIVE: completed_document(APP, MODEL, VOCAB, SERVER_LIMITS),
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


@pytest.mark.xfail(strict=True, reason="B1: the app serves no OpenAPI document (openapi_config=None in web/app.py)")
def test_the_app_serves_a_complete_openapi_document(tmp_path: Path) -> None:
    with TestClient(app=new_app(tmp_path)) as http:
        response = http.get("/schema/openapi.json", headers=ADMIN)
    assert response.status_code == 200
    chat = response.json()["paths"]["/v1/chat/completions"]["post"]
    assert "requestBody" in chat and "401" in chat["responses"]
    assert '"error"' in str(chat["responses"]["400"]).replace("'", '"')


def test_litestar_alone_documents_the_wrong_error_shape() -> None:
    """Why the document is completed: what Litestar generates says a 400 is {status_code, detail, extra}, while
    the app answers every error in OpenAI's shape (web/errors.py); and it knows no /v1 request body."""
    generated = generated_document(APP)
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


def target_for(mode: GenerationMode, directory: Path) -> Target:
    schema = schemathesis.openapi.from_dict(copy.deepcopy(DOCUMENTS[mode]))
    schema.app = new_app(directory)  # schemathesis's ASGI client runs the app's lifespan and its requests in-process
    ready = schema["/ready"]["GET"].Case()
    deadline = time.monotonic() + 10
    while ready.call().status_code != 200:
        assert time.monotonic() < deadline, "the app never became ready"
        time.sleep(0.01)
    created = schema["/admin/api/keys"]["POST"].Case(body={"name": "fuzz"}).call(headers=ADMIN)
    assert created.status_code == 201, created.text
    return Target(schema, created.json()["key"], created.json()["info"]["id"])


def _ints(value: Any) -> Iterator[int]:
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, str) and value.lstrip("-").isdigit():
        yield int(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _ints(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _ints(item)


def _overflowing_datetime(value: Any) -> bool:
    try:
        datetime.fromisoformat(str(value)).astimezone(UTC)
    except OverflowError:
        return True
    except ValueError:
        return False
    return False


def hits_a_known_bug(case: schemathesis.Case) -> bool:
    """Inputs that have a strict-xfail test of their own (BUGS.md B2, B3, B10); drop this when they are fixed."""
    if case.path.startswith("/v1/") and isinstance(case.body, dict):
        wide = [case.body.get(name) for name in ("seed", "top_k")]
        return any(isinstance(n, int) and not INT64_MIN <= n <= UINT64_MAX for n in wide)
    if not case.path.startswith("/admin/api"):
        return False
    values = [case.path_parameters, case.query, case.body if isinstance(case.body, dict | list) else None]
    out_of_int64 = any(not INT64_MIN <= n <= INT64_MAX for n in _ints(values))
    return out_of_int64 or any(_overflowing_datetime(v) for v in (case.query or {}).values())


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


@pytest.mark.parametrize(("method", "path", "mode"), CASES, ids=[f"{m} {p} {mode}" for m, p, mode in CASES])
def test_operation_answers_within_its_document(
    request: pytest.FixtureRequest, tmp_path: Path, method: str, path: str, mode: GenerationMode
) -> None:
    target = target_for(mode, tmp_path)
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
        assume(not hits_a_known_bug(case))
        seen["tried"] += 1
        response = case.call(headers=dict(headers_for(path, target.key)))
        seen["5xx"] += response.status_code >= 500
        case.validate_response(response)

    try:
        run()
    finally:
        bad = seen["tried"] if mode == GenerationMode.NEGATIVE else 0
        figures(request, {"schemathesis cases": seen["tried"], TRIED: bad, SERVER_ERRORS: seen["5xx"]})
