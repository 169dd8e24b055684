"""Conversations on the server, in a real browser (Debian's chromium): a signed-in person chats, and the conversation
is there after a reload and in a second browser signed in as the same person (nothing of it in the browser's
storage), and the search finds it by its text; another person signed in on the same browser sees none of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.browser.chat_page import send
from tests.browser.conftest import PageProblems, Server, new_context

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Response

expect = pytest.importorskip("playwright.sync_api").expect
PASSWORD = "a person's browser password"
SECRET = "Remember the blue lighthouse at dawn"


def _person(server: Server, name: str) -> None:
    with server.admin() as api:
        response = api.post("/admin/api/users", json={"username": name, "password": PASSWORD})
    assert response.status_code == 201, response.text


def _sign_in(page: Page, server: Server, name: str) -> None:
    page.goto("/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", PASSWORD)
    page.click("form button[type=submit]")
    page.wait_for_url(server.url + "/")
    expect(page.locator("#person")).to_have_text(name)


def _saved_messages(response: Response) -> bool:
    return response.url.endswith("/messages") and response.request.method == "PUT"


def test_a_conversation_follows_its_person_and_no_one_else(page: Page, browser: Browser, server: Server) -> None:
    _person(server, "keeper")
    _person(server, "stranger")
    _sign_in(page, server, "keeper")
    with page.expect_response(_saved_messages, timeout=60_000) as saved:
        send(page, SECRET)
    assert saved.value.status == 200, saved.value.text()
    reply = page.locator(".message.assistant .content").last.inner_text()
    expect(page.locator("#conversations li.active .open")).to_have_text(SECRET)

    page.reload()
    expect(page.locator("#conversations li.active .open")).to_have_text(SECRET)
    expect(page.locator(".message.user")).to_have_text(SECRET)
    expect(page.locator(".message.assistant .content")).to_have_text(reply)
    assert SECRET not in page.evaluate("JSON.stringify(Object.entries(localStorage))"), "nothing kept in the browser"

    other = new_context(browser, server)
    problems = PageProblems()
    try:
        elsewhere = other.new_page()
        problems.watch(elsewhere)
        _sign_in(elsewhere, server, "keeper")
        expect(elsewhere.locator("#conversations li.active .open")).to_have_text(SECRET)
        expect(elsewhere.locator(".message.user")).to_have_text(SECRET)
        expect(elsewhere.locator(".message.assistant .content")).to_have_text(reply)
        elsewhere.on("dialog", lambda dialog: dialog.accept("Lighthouse notes"))
        with elsewhere.expect_response(lambda r: r.request.method == "PATCH"):
            elsewhere.click("#conversations li.active .rename")
    finally:
        other.close()
    assert not problems.errors, problems.errors
    page.reload()
    expect(page.locator("#conversations li.active .open")).to_have_text("Lighthouse notes")
    page.click("#new-chat")
    with page.expect_response(_saved_messages, timeout=60_000):
        send(page, "Another topic entirely")
    expect(page.locator("#conversations li")).to_have_count(2)
    page.fill("#search", "LIGHTHOUSE AT")  # the first message's text, in any case
    expect(page.locator("#conversations li .open")).to_have_text(["Lighthouse notes"])
    page.fill("#search", "")
    expect(page.locator("#conversations li")).to_have_count(2)

    page.click("#sign-out button")
    page.wait_for_url("**/login")
    _sign_in(page, server, "stranger")
    expect(page.locator("#conversations li")).to_have_count(1)
    expect(page.locator("#conversations")).not_to_contain_text("Lighthouse")
    expect(page.locator(".message")).to_have_count(0)
    assert SECRET not in page.content()
    listed = page.evaluate("fetch('/api/conversations').then((r) => r.json())")
    assert listed == {"data": [], "has_more": False}
