"""The admin console in a real browser against a real appliance: sign-in and its limits, CSRF, the live panel
under load, keys made in the console and used in the chat, the history with its detail and CSV, inert XSS."""

from __future__ import annotations

import csv as csvlib
import io
import re
import time
from typing import TYPE_CHECKING

import pytest

from tests.browser.chat_page import XSS_IMG, XSS_SCRIPT, assert_inert, open_chat, send
from tests.browser.conftest import ADMIN_PASSWORD, SCREENSHOTS, Server, new_context
from tests.browser.load import Load

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

expect = pytest.importorskip("playwright.sync_api").expect


def test_sign_in_rejects_wrong_passwords_and_limits_repeated_failures(browser: Browser, server: Server) -> None:
    # A separate client address (uvicorn trusts X-Forwarded-For from localhost), so the limit does not lock
    # out the other tests' sign-ins from 127.0.0.1.
    attacker = new_context(browser, server, extra_http_headers={"X-Forwarded-For": "203.0.113.7"})
    page = attacker.new_page()
    statuses = []
    for _ in range(5):
        page.goto("/admin")
        page.fill("input[name=password]", "wrong password")
        with page.expect_response(lambda r: r.url.endswith("/admin/login") and r.request.method == "POST") as info:
            page.click("form button[type=submit]")
        statuses.append(info.value.status)
        expect(page.locator(".error")).to_have_text("Wrong user name or password.")
    assert statuses == [401] * 5
    page.fill("input[name=password]", ADMIN_PASSWORD)
    with page.expect_response(lambda r: r.url.endswith("/admin/login") and r.request.method == "POST") as info:
        page.click("form button[type=submit]")
    assert info.value.status == 429
    assert info.value.headers["retry-after"].isdigit()
    expect(page.locator(".error")).to_contain_text("Too many failed sign-ins")
    assert page.context.cookies() == [] or all(c["name"] != "appliance_session" for c in page.context.cookies())
    attacker.close()


def test_session_cookie_csrf_and_logout(console: Page, server: Server) -> None:
    cookie = next(c for c in console.context.cookies() if c["name"] == "appliance_session")
    # One session for the console and the chat page (web/people): the cookie is the whole site's.
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/"
    api = console.context.request
    assert api.post("/admin/keys", form={"name": "no token"}).status == 403
    assert api.post("/admin/keys", form={"name": "bad token", "csrf_token": "forged"}).status == 403
    assert api.post("/admin/keys", form={"name": "bad header"}, headers={"X-CSRF-Token": "forged"}).status == 403
    assert api.post("/admin/logout").status == 403
    token = console.locator("meta[name=csrf-token]").get_attribute("content")
    assert token
    created = api.post("/admin/keys", form={"name": "with token", "csrf_token": token}, max_redirects=0)
    assert created.status == 201
    assert "with token" in created.text()

    htmx = {"HX-Request": "true", "HX-Target": "engine-counters"}
    fragment = api.get("/admin", headers=htmx).text()
    assert fragment.startswith('<div id="engine-counters"') and "<html" not in fragment
    assert "<html" in api.get("/admin").text()
    restore = api.get("/admin", headers={**htmx, "HX-History-Restore-Request": "true"}).text()
    assert "<html" in restore  # htmx restoring history needs the whole page

    console.click("form.logout button")
    console.wait_for_url("**/admin/login")
    console.goto("/admin/keys")
    expect(console).to_have_url(re.compile(r"/admin/login\?next=%2Fadmin%2Fkeys$"))


def metric(page: Page, name: str) -> str:
    return page.locator(f"[data-metric={name}]").inner_text()


def test_live_panel_follows_the_load(console: Page, server: Server) -> None:
    expect(console.locator("#engine-state .badge")).to_have_text("ready")
    expect(console.locator("[data-metric=memory-kind]")).to_have_text("RAM")
    expect(console.locator("#memory rect.seg")).to_have_count(5)
    expect(console.locator("[data-metric=running]")).to_have_text("0", timeout=20_000)
    generated_before = int(metric(console, "generated").replace(",", ""))
    with Load(server.url, server.new_key("load"), count=4) as load:
        expect(console.locator("[data-metric=running]")).not_to_have_text("0", timeout=15_000)
        expect(console.locator("[data-metric=tokens-per-s]")).not_to_have_text(re.compile(r"^(–|0\.0)$"))
        expect(console.locator("[data-metric=kv-used]")).not_to_have_text("0.0%")
        assert int(metric(console, "generated").replace(",", "")) > generated_before
        expect(console.locator("#diagnosis .headline")).to_be_visible()
        # For the screenshot: wait until the charts have redrawn with samples taken under this load.
        expect(console.locator(".chart-load path.line").first).to_have_attribute("d", re.compile(r"L"), timeout=25_000)
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        console.screenshot(path=str(SCREENSHOTS / "console.png"), full_page=True)
        assert not load.errors, load.errors
    expect(console.locator("[data-metric=running]")).to_have_text("0", timeout=15_000)
    expect(console.locator("#charts path.line").first).to_be_attached(timeout=15_000)


def test_key_from_the_console_is_used_in_the_chat_and_shows_in_the_history(console: Page, server: Server) -> None:
    console.context.grant_permissions(["clipboard-read", "clipboard-write"])
    name = f"alice {XSS_IMG}"
    console.goto("/admin/keys")
    console.fill("#key-create input[name=name]", name)
    console.fill("#key-create input[name=quota_tokens]", "50000")
    console.select_option("#key-create select[name=quota_period]", "day")
    console.click("#key-create button[type=submit]")
    key = console.locator("#new-key").input_value()
    assert key.startswith("sk-")
    console.click("button.copy")
    expect(console.locator("button.copy")).to_have_text("Copied")
    assert console.evaluate("navigator.clipboard.readText()") == key
    card = console.locator(".key-card", has_text=name)
    expect(card.locator(".key-name")).to_have_text(name)
    assert_inert(console)

    card.get_by_role("button", name="Edit").click()
    console.fill(".key-card.editing input[name=max_tokens_per_request]", "many")
    console.click(".key-card.editing button[type=submit]")
    expect(console.locator(".key-card.editing .error")).to_contain_text("whole number")
    console.fill(".key-card.editing input[name=max_tokens_per_request]", "64")
    console.click(".key-card.editing button[type=submit]")
    expect(card.locator(".limits")).to_contain_text("64")

    # Another browser: in the admin's own, the chat page speaks with the admin's session, not a key.
    chat_context = new_context(console.context.browser, server)  # type: ignore[arg-type]
    chat = chat_context.new_page()
    open_chat(chat, key, max_tokens=8)
    prompt = f"history check {XSS_SCRIPT} {XSS_IMG}"
    send(chat, prompt)
    expect(chat.locator(".message.assistant .stats")).to_contain_text("TTFT", timeout=30_000)
    chat_context.close()

    console.goto("/admin/history")
    row = console.locator("#history-table tbody tr", has_text=name).first
    expect(row.locator(".status")).to_have_text("finished", timeout=10_000)
    expect(row.locator(".key-name")).to_have_text(name)
    assert_inert(console)
    console.select_option("select[name=status]", "cancelled")
    expect(console.locator("#history-table tbody tr", has_text=name)).to_have_count(0)
    assert "status=cancelled" in console.url
    console.select_option("select[name=status]", "finished")
    console.select_option("select[name=key]", label=name)
    expect(console.locator("#history-table tbody tr")).to_have_count(1)
    export = console.locator("a", has_text="Export CSV")
    # The link is re-rendered with the filters; read it only once it carries both.
    expect(export).to_have_attribute("href", re.compile(r"(?=.*status=finished)(?=.*key=)"))
    csv = console.context.request.get(export.get_attribute("href") or "")
    # Parsed, not counted by newlines: a stored reply may contain line breaks inside its quoted cell.
    records = list(csvlib.reader(io.StringIO(csv.text())))
    assert csv.ok and len(records) == 2 and "alice" in records[1][0]
    console.fill("input[name=since]", "2099-01-01T00:00")
    console.click(".filters button[type=submit]")
    expect(console.locator("#history-table")).to_contain_text("No requests match.")
    console.go_back()
    console.go_back()

    console.goto("/admin/history")
    console.locator("#history-table tbody tr", has_text=name).first.locator("a.request-link").click()
    expect(console.locator(".prompt-text")).to_contain_text(prompt)
    expect(console.locator(".request-detail .key-name")).to_contain_text(name)
    expect(console.locator(".response-text")).not_to_be_empty()
    assert_inert(console)

    console.goto("/admin/keys")
    console.once("dialog", lambda dialog: dialog.accept())
    console.locator(".key-card", has_text=name).get_by_role("button", name="Revoke").click()
    expect(console.locator(".key-card", has_text=name).locator(".badge")).to_contain_text("revoked")
    time.sleep(0.1)
    chat_context = new_context(console.context.browser, server)  # type: ignore[arg-type]
    chat = chat_context.new_page()
    open_chat(chat, key)
    send(chat, "still there?")
    expect(chat.locator(".message.assistant .error").last).to_contain_text("revoked")
    chat_context.close()
