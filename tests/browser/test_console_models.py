"""The console's Models page in a real browser against a real appliance (issue 16): the served model marked, a
model that does not fit refused with the reason, and "Serve this model" switching the engine to another one."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

from tests.browser.conftest import Server, appliance, missing_assets, new_context, sign_in

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

expect = pytest.importorskip("playwright.sync_api").expect


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """Its own appliance (a switch must not change the model the other browser tests chat with), its models
    folder holding a tiny HF directory and a GGUF whose header describes a 70B-shaped model."""
    if missing_assets():
        pytest.fail("front-end assets not fetched: run `python -m web.static.assets`")
    data = tmp_path_factory.mktemp("models-appliance")
    with appliance(data) as server:
        _tiny_hf_dir(data / "models" / "random-tiny", data / "models" / "tiny-llama")
        _huge_gguf(data / "models" / "huge-70b.gguf")
        yield server


def _tiny_hf_dir(base: Path, target: Path) -> None:
    """The server's random:tiny config and tokenizer (written at its start), with weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    staging = target.with_name(".staging")
    shutil.copytree(base, staging)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(base)).save_pretrained(staging)
    staging.rename(target)


def _huge_gguf(path: Path) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    for add, value in (
        (writer.add_context_length, 8192),
        (writer.add_embedding_length, 8192),
        (writer.add_block_count, 80),
        (writer.add_feed_forward_length, 28672),
        (writer.add_head_count, 64),
        (writer.add_head_count_kv, 8),
    ):
        add(value)
    writer.add_token_list([f"t{i}" for i in range(128)])
    writer.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))  # the header is all that is read
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture
def models_page(browser: Browser, served: Server) -> Iterator[Page]:
    context = new_context(browser, served)
    context.set_default_timeout(120_000)  # a switch loads a model
    page = context.new_page()
    sign_in(page)
    page.wait_for_url("**/admin")
    page.click("nav.tabs a[href='/admin/models']")
    page.wait_for_url("**/admin/models")
    yield page
    context.close()


def test_the_models_page_refuses_what_does_not_fit_and_switches_the_served_model(models_page: Page) -> None:
    page = models_page
    row = page.locator("tr.model")
    expect(page.locator("tr.model.served")).to_have_attribute("data-model", "random:tiny")
    expect(row.filter(has_text="tiny-llama")).to_contain_text("fits: weights")
    huge = page.locator("tr[data-model='huge-70b.gguf']")
    expect(huge).to_contain_text("does not fit")

    huge.get_by_role("button", name="Serve this model").click()
    expect(page.locator(".error")).to_contain_text("huge-70b.gguf does not fit")
    expect(page.locator("tr.model.served")).to_have_attribute("data-model", "random:tiny")

    page.locator("tr[data-model='tiny-llama']").get_by_role("button", name="Serve this model").click()
    expect(page.locator("[role=status]")).to_have_text("Now serving tiny-llama.")
    expect(page.locator("tr.model.served")).to_have_attribute("data-model", "tiny-llama")
    answer = page.context.request.get("/ready")
    assert answer.ok, answer.text()
