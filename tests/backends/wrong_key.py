"""A backend entry with a wrong key says why, in the doctor, in /ready and in the console's backends panel: the
check the remote tokenizer tests share (vLLM's, llama.cpp's)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from appliance.doctor.backends import backends_finding
from appliance.settings import load_settings
from tests.web.conftest import ADMIN
from tests.web.server import Server, start_server

WRONG_KEY = "its model list answered 401 (a wrong key in its entry?)"


def a_wrong_key_is_named(data_dir: Path, entry: str) -> None:
    found = backends_finding(load_settings({"APPLIANCE_DATA_DIR": str(data_dir), "APPLIANCE_BACKENDS": entry}))
    assert found.level == "fail" and WRONG_KEY.removeprefix("its model list ") in found.message, found
    server = start_server(data_dir / "wrong", backends=entry)
    try:
        deadline = time.monotonic() + 120
        while "first probe" in (why := ready_refusal(server)) or why == "":
            assert time.monotonic() < deadline, why
            time.sleep(0.3)
        assert WRONG_KEY in why, why
        [status] = httpx.get(server.url + "/admin/api/backends", headers=ADMIN).json()
        assert status["models"] == [] and status["reason"] == WRONG_KEY
    finally:
        server.kill()


def ready_refusal(server: Server) -> str:
    """/ready's refusal ("" while the server does not answer yet); a 200 is a failure here."""
    try:
        r = httpx.get(server.url + "/ready", timeout=2)
    except httpx.HTTPError:
        return ""
    assert r.status_code == 503, r.text
    message: str = r.json()["error"]["message"]
    return message
