"""XSS: payloads in prompts, replies, key names, the user field, the model field and refusal messages stay inert in
every server-rendered page, full and htmx fragment: they appear only escaped, no element gains a script or an
event handler, and every page carries the Content-Security-Policy. (tests/browser runs some of these in a real
browser; this covers every page and fragment without one.)"""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import closing
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import pytest
from markupsafe import escape

from engine import RequestOutput, SamplingParams
from tests.security.conftest import Appliance, Session, figures, headers_for, serve
from tests.web.conftest import MODEL
from tests.web.fakes import FakeEngineClient
from web.console.auth import CSRF_HEADER
from web.console.dashboard import PARTIALS as DASHBOARD_PARTIALS
from web.static import STATIC_DIR, VENDOR_DIR
from web.static.assets import ASSETS, is_current

PAYLOADS = (
    '<script>alert("xss-script")</script>',
    '"><img src=x onerror=alert("xss-img")>',
    "'><svg onload=alert('xss-svg')>",
    '</textarea></pre><iframe src="javascript:alert(`xss-frame`)"></iframe>',
)
ALL = " ".join(PAYLOADS)
FORBIDDEN_TAGS = {"iframe", "object", "embed", "base"}


class ScriptingReply(FakeEngineClient):
    """The fake engine, replying with the payloads instead of "t0 t1 ..."."""

    async def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> AsyncIterator[RequestOutput]:
        async for out in super().generate(prompt, params, request_id, arrival_time):
            out.text = PAYLOADS[out.token_ids[0] % len(PAYLOADS)] if out.token_ids else ""
            yield out


class Inspector(HTMLParser):
    """What in a page could run: scripts (only /static/ files may), event handlers, javascript: URLs, frames."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        if tag == "script":
            self._in_script = True
            if not (values.get("src") or "").startswith("/static/"):
                self.problems.append(f"a script not from /static/: {values}")
        if tag in FORBIDDEN_TAGS:
            self.problems.append(f"a <{tag}> element")
        for name, value in attrs:
            if name.startswith("on"):
                self.problems.append(f"an event handler {name}={value!r} on <{tag}>")
            if name in ("href", "src", "action", "formaction") and (value or "").strip().lower().startswith("javas"):
                self.problems.append(f"a javascript: URL in {name} of <{tag}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.problems.append(f"an inline script: {data[:80]!r}")


def assert_walled(response: Any, where: str) -> None:
    """The second wall: a policy that runs no inline script and lets no other site frame the page."""
    csp = response.headers.get("content-security-policy", "")
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, where
    assert response.headers.get("x-content-type-options") == "nosniff", where


def assert_inert(response: Any, where: str) -> int:
    """The page shows the payloads only escaped; returns how many payloads it shows. Plain text (what the console
    answers htmx with on a refusal) is no page: console.js shows it with textContent."""
    assert response.status_code < 500, f"{where}: {response.status_code}"
    if response.headers["content-type"].startswith("text/plain"):
        return sum(p in response.text for p in PAYLOADS)
    assert response.headers["content-type"].startswith("text/html"), where
    page = response.text
    for payload in PAYLOADS:
        assert payload not in page, f"{where} shows {payload!r} unescaped"
    inspector = Inspector()
    inspector.feed(page)
    assert not inspector.problems, f"{where}: {inspector.problems}"
    return sum(str(escape(p)) in page for p in PAYLOADS)


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Appliance, Session]]:
    """An appliance that stores text, whose engine replies with payloads, and whose keys, prompts, user fields,
    models and refusals carry them."""
    with serve(tmp_path_factory.mktemp("xss"), fake=ScriptingReply(), store_text=True) as served:
        session = served.sign_in()
        key_id, key = served.new_key(PAYLOADS[0] + PAYLOADS[1])
        created = served.post_form(
            session, "/admin/keys", {"name": PAYLOADS[2], "quota_period": "none"}, **{CSRF_HEADER: session.csrf}
        )
        assert created.status_code == 201
        user = headers_for("/v1", key)
        messages = [{"role": "system", "content": PAYLOADS[3]}, {"role": "user", "content": ALL}]
        for body in (
            {"model": MODEL, "messages": messages, "user": ALL, "max_tokens": 4},
            {"model": MODEL, "messages": messages, "user": PAYLOADS[1], "stream": True},
            {"model": ALL, "messages": messages},  # refused: the row keeps the model and the message names it
            {"model": MODEL, "messages": [{"role": PAYLOADS[0], "content": "x"}]},
        ):
            served.http.post("/v1/chat/completions", json=body, headers=user)
        served.http.post("/v1/completions", json={"model": MODEL, "prompt": ALL, "user": ALL}, headers=user)
        served.flush_history()
        served.keys["payload"] = str(key_id)
        yield served, session


def _request_ids(served: Appliance) -> list[str]:
    with closing(sqlite3.connect(served.db_path)) as conn:
        return [row[0] for row in conn.execute("SELECT id FROM requests")]


def _pages(served: Appliance) -> dict[str, tuple[str, dict[str, str]]]:
    """Every server-rendered page and fragment that can show the payloads: name -> (path, extra headers)."""
    key_id = served.keys["payload"]
    htmx = {"HX-Request": "true"}
    q = [quote(p, safe="") for p in PAYLOADS]
    table = {**htmx, "HX-Target": "history-table"}
    pages: dict[str, tuple[str, dict[str, str]]] = {
        "chat page": ("/", {}),
        "dashboard": ("/admin", {}),
        "history": ("/admin/history", {}),
        "history filtered by payloads": (f"/admin/history?key={key_id}&since={q[1]}&until={q[0]}", {}),
        "history table fragment": ("/admin/history", table),
        "history fragment with bad filters": (f"/admin/history?key={q[0]}", table),
        "keys": ("/admin/keys", {}),
        "keys list fragment": ("/admin/keys", {**htmx, "HX-Target": "keys-list"}),
        "key card fragment": (f"/admin/keys/{key_id}", htmx),
        "key edit fragment": (f"/admin/keys/{key_id}/edit", htmx),
        "login page with a payload next": (f"/admin/login?next={q[1]}", {}),
    }
    pages.update({f"dashboard {p} fragment": ("/admin", {**htmx, "HX-Target": p}) for p in DASHBOARD_PARTIALS})
    pages.update({f"request {rid}": (f"/admin/history/{rid}", {}) for rid in _request_ids(served)})
    return pages


def test_every_page_and_fragment_shows_payloads_only_escaped(
    request: pytest.FixtureRequest, stage: tuple[Appliance, Session]
) -> None:
    served, session = stage
    shown = {}
    for name, (path, headers) in _pages(served).items():
        response = served.page(None if path.startswith("/admin/login") else session, path, **headers)
        assert response.status_code == 200, f"{name}: {response.status_code}"
        shown[name] = assert_inert(response, name)
        assert_walled(response, name)
    assert shown["keys"] >= 3 and shown["key card fragment"] >= 2 and shown["key edit fragment"] >= 2
    assert shown["history"] >= 2 and shown["history table fragment"] >= 2
    assert shown["history filtered by payloads"] >= 2 and shown["login page with a payload next"] >= 1
    details = [count for name, count in shown.items() if name.startswith("request ")]
    assert len(details) == 5 and min(details) >= 1 and max(details) == len(PAYLOADS)
    figures(request, {"XSS pages and fragments checked": len(shown)})


def test_forms_that_echo_their_input_escape_it(
    request: pytest.FixtureRequest, stage: tuple[Appliance, Session]
) -> None:
    served, session = stage
    key_id = served.keys["payload"]
    csrf = {CSRF_HEADER: session.csrf}
    htmx = {"HX-Request": "true", **csrf}
    refused = {"name": ALL, "quota_tokens": PAYLOADS[1], "quota_period": "none"}  # not a number: re-shown, 422
    echoes = {
        "create, refused, htmx": served.post_form(session, "/admin/keys", refused, **htmx),
        "create, refused, plain": served.post_form(session, "/admin/keys", refused, **csrf),
        "create, accepted, htmx": served.post_form(session, "/admin/keys", {"name": ALL}, **htmx),
        "edit, refused": served.post_form(session, f"/admin/keys/{key_id}", refused, **htmx),
        "edit, accepted": served.post_form(session, f"/admin/keys/{key_id}", {"name": PAYLOADS[3]}, **htmx),
        "edit, bad period": served.post_form(
            session, f"/admin/keys/{key_id}", {"name": ALL, "quota_period": PAYLOADS[0]}, **htmx
        ),
    }
    for name, response in echoes.items():
        assert assert_inert(response, name) >= 1, name
    assert echoes["create, refused, htmx"].status_code == 422 and echoes["create, accepted, htmx"].status_code == 201
    figures(request, {"XSS pages and fragments checked": len(echoes)})


def _error_pages(served: Appliance) -> dict[str, tuple[str, dict[str, str]]]:
    """Refusals the console renders itself, each naming what it was given."""
    reflected = quote(PAYLOADS[1], safe="")  # no "/" in it: the route takes one segment
    return {
        "unknown request": (f"/admin/history/{reflected}", {}),
        "unknown request, htmx": (f"/admin/history/{reflected}", {"HX-Request": "true"}),
        "unknown key, htmx": ("/admin/keys/999999/edit", {"HX-Request": "true"}),
        "offset not a number": (f"/admin/history?offset={reflected}", {}),
    }


def test_error_pages_show_what_they_were_given_escaped(
    request: pytest.FixtureRequest, stage: tuple[Appliance, Session]
) -> None:
    served, session = stage
    for name, (path, headers) in _error_pages(served).items():
        response = served.page(session, path, **headers)
        assert 400 <= response.status_code < 500, f"{name}: {response.status_code}"
        assert_inert(response, name)
    assert assert_inert(served.page(session, *_error_pages(served)["unknown request"][:1]), "unknown request") == 1
    figures(request, {"XSS pages and fragments checked": len(_error_pages(served))})


def test_error_pages_carry_the_content_security_policy(stage: tuple[Appliance, Session]) -> None:
    served, session = stage
    for name, (path, headers) in _error_pages(served).items():
        assert_walled(served.page(session, path, **headers), name)


def test_the_history_export_is_a_download_not_a_page(stage: tuple[Appliance, Session]) -> None:
    served, session = stage
    response = served.page(session, "/admin/history.csv")
    assert response.status_code == 200 and "<script>alert(" in response.text  # raw in a CSV cell is fine...
    assert response.headers["content-type"].startswith("text/csv")  # ...as long as no browser renders it
    assert response.headers["content-disposition"].startswith("attachment")
    assert response.headers["x-content-type-options"] == "nosniff"


CHAT_SCRIPTS = ("chat.js", "chat-api.js", "chat-store.js", "markdown.js")
HTML_SINKS = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "createContextualFragment")


def test_the_chat_puts_model_output_in_the_page_only_through_the_sanitizer() -> None:
    """The chat's own scripts never write HTML into the page: replies reach it as DOM text or as the DOM fragment
    DOMPurify returns; markdown.js imports only the pinned libraries the appliance serves."""
    for name in CHAT_SCRIPTS:
        source = (STATIC_DIR / "js" / name).read_text()
        assert not [sink for sink in HTML_SINKS if sink in source], name
    markdown = (STATIC_DIR / "js" / "markdown.js").read_text()
    imported = re.findall(r'^import .* from "([^"]+)";$', markdown, re.MULTILINE)
    targets = {f"../vendor/{a.target}" for a in ASSETS}
    assert imported and set(imported) <= targets, imported
    assert "RETURN_DOM_FRAGMENT: true" in markdown and "html: false" in markdown


def test_the_rendering_libraries_are_served_pinned_as_scripts(stage: tuple[Appliance, Session]) -> None:
    """No CDN: the appliance serves the exact pinned bytes, as JavaScript (a module script of another type is
    refused, and nosniff keeps the browser from guessing)."""
    if not all(is_current(a, VENDOR_DIR) for a in ASSETS):
        pytest.skip("the front-end assets are not fetched here (make setup fetches them)")
    served, _ = stage
    for asset in ASSETS:
        response = served.page(None, f"/static/vendor/{asset.target}")
        assert response.status_code == 200, asset.target
        assert hashlib.sha256(response.content).hexdigest() == asset.sha256, asset.target
        kind = "text/css" if asset.target.endswith(".css") else "text/javascript"
        assert response.headers["content-type"].startswith(kind), (asset.target, response.headers["content-type"])
