"""A key's fair share (issue 12): its weight and class through the admin API and the console form; bad values
are refused in the API's error shape and change nothing."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.security.conftest import serve
from tests.web.conftest import ADMIN, assert_openai_error


async def test_weight_and_class_through_the_admin_api(client: Any) -> None:
    created = await client.post("/admin/api/keys", json={"name": "plain"}, headers=ADMIN)
    info = created.json()["info"]
    assert (info["weight"], info["priority"]) == (1.0, "interactive"), "the defaults of a new key"
    body = {"name": "nightly", "weight": 0.25, "priority": "batch"}
    batch = (await client.post("/admin/api/keys", json=body, headers=ADMIN)).json()["info"]
    assert (batch["weight"], batch["priority"]) == (0.25, "batch")
    patched = await client.patch(f"/admin/api/keys/{batch['id']}", json={"weight": 3}, headers=ADMIN)
    assert patched.status_code == 200, patched.text
    assert (patched.json()["weight"], patched.json()["priority"]) == (3.0, "batch"), "left out keeps its value"
    again = (await client.get(f"/admin/api/keys/{batch['id']}", headers=ADMIN)).json()
    assert (again["weight"], again["priority"]) == (3.0, "batch")


@pytest.mark.parametrize(
    "body",
    [{"weight": 0}, {"weight": -1}, {"weight": "heavy"}, {"weight": 1e9}, {"priority": "urgent"}],
)
async def test_bad_weight_or_class_is_refused(client: Any, body: dict[str, Any]) -> None:
    error = assert_openai_error(await client.post("/admin/api/keys", json={"name": "x", **body}, headers=ADMIN), 400)
    assert error["param"] == next(iter(body))
    created = (await client.post("/admin/api/keys", json={"name": "y"}, headers=ADMIN)).json()["info"]
    response = await client.patch(f"/admin/api/keys/{created['id']}", json=body, headers=ADMIN)
    assert_openai_error(response, 400)
    unchanged = (await client.get(f"/admin/api/keys/{created['id']}", headers=ADMIN)).json()
    assert (unchanged["weight"], unchanged["priority"]) == (1.0, "interactive")


def test_weight_and_class_through_the_console_form(tmp_path: Path) -> None:
    with serve(tmp_path) as appliance:
        session = appliance.sign_in()
        form = {"name": "crawler", "weight": "0.5", "priority": "batch", "quota_period": "none"}
        created = appliance.post_form(session, "/admin/keys", {**form, "csrf_token": session.csrf})
        assert created.status_code == 201, created.text
        (key,) = appliance.http.get("/admin/api/keys", headers=ADMIN).json()
        assert (key["weight"], key["priority"]) == (0.5, "batch")
        card = appliance.page(session, "/admin/keys").text
        assert re.search(r"weight 0\.5, batch", card), "the key's card shows its share"
        edit = appliance.page(session, f"/admin/keys/{key['id']}/edit", **{"HX-Request": "true"}).text
        assert 'name="weight"' in edit and 'value="0.5"' in edit
        assert re.search(r'<option value="batch"\s+selected', edit)

        bad = appliance.post_form(session, f"/admin/keys/{key['id']}", {**form, "weight": "lots"}, **_htmx(session))
        assert bad.status_code == 422 and "Weight must be a number" in bad.text
        zero = appliance.post_form(session, f"/admin/keys/{key['id']}", {**form, "weight": "0"}, **_htmx(session))
        assert zero.status_code == 422 and "weight must be a number from" in zero.text
        good = {**form, "weight": "2", "priority": "interactive"}
        saved = appliance.post_form(session, f"/admin/keys/{key['id']}", good, **_htmx(session))
        assert saved.status_code == 200, saved.text
        (key,) = appliance.http.get("/admin/api/keys", headers=ADMIN).json()
        assert (key["weight"], key["priority"]) == (2.0, "interactive")


def _htmx(session: Any) -> dict[str, str]:
    return {"HX-Request": "true", "X-CSRF-Token": session.csrf}
