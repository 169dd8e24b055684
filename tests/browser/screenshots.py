"""The README's screenshots, taken with the bundled model (SmolLM2-135M-Instruct) answering for real: nothing is
pre-loaded into the chat, and the console is shot while a few chats stream. Run from a set-up checkout:

    .venv/bin/python -m tests.browser.screenshots            # writes docs/screenshots/chat.png and console.png

It starts its own appliance (a temporary data directory, the default model and its automatic quantization), so
any running one is left alone. A real model on a CPU is slow: the run takes a minute or two."""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

import httpx
from playwright.sync_api import Page, expect, sync_playwright

from tests.browser.chat_page import open_chat, send
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, REPO, Server, appliance, missing_assets, sign_in
from tests.browser.load import Load

OUT = REPO / "docs" / "screenshots"
QUESTIONS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a short Python function that reverses a string, in a code block.",
)
LOAD_PROMPT = "Tell me about the history of the bicycle."
REPLY_TIMEOUT_MS = 240_000


def served_model(server: Server) -> str:
    key = server.new_key("screenshots-probe")
    listed = httpx.get(server.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
    listed.raise_for_status()
    return str(listed.json()["data"][0]["id"])


def chat_shot(page: Page, server: Server, out: Path) -> None:
    open_chat(page, server.new_key("alice"), max_tokens=160)
    for n, question in enumerate(QUESTIONS):
        send(page, question)
        reply = page.locator(".message.assistant").nth(n)
        expect(reply.locator(".stats")).to_contain_text("TTFT", timeout=REPLY_TIMEOUT_MS)
    page.screenshot(path=str(out / "chat.png"))


def console_shot(page: Page, server: Server, out: Path, model: str) -> None:
    sign_in(page)
    page.wait_for_url("**/admin")
    with Load(server.url, server.new_key("staff-chat"), count=4, max_tokens=200, model=model, prompt=LOAD_PROMPT):
        expect(page.locator("[data-metric=running]")).not_to_have_text("0", timeout=60_000)
        # The charts redraw every 10 s from samples taken every 5 s: wait for a line drawn under this load.
        expect(page.locator(".chart-load path.line").first).to_have_attribute("d", re.compile(r"L"), timeout=60_000)
        expect(page.locator("[data-metric=tokens-per-s]")).not_to_have_text(re.compile(r"^(–|0\.0)$"))
        page.screenshot(path=str(out / "console.png"), full_page=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"where the PNGs go (default: {OUT})")
    args = parser.parse_args(argv)
    if missing_assets():
        print("front-end assets are missing: run `python -m web.static.assets`", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory() as data,
        appliance(
            Path(data), APPLIANCE_MODEL="default", APPLIANCE_QUANTIZATION="auto", APPLIANCE_NUM_KV_BLOCKS="2048"
        ) as server,
        sync_playwright() as playwright,
    ):
        model = served_model(server)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 860})
        context.set_default_timeout(30_000)
        try:
            chat_shot(context.new_page(), server, args.out)
            console_shot(context.new_page(), server, args.out, model)
        except httpx.HTTPError as exc:
            print(f"the appliance failed a request: {exc}", file=sys.stderr)
            return 1
        finally:
            browser.close()
    print(f"wrote {args.out / 'chat.png'} and {args.out / 'console.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
