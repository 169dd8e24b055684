"""People for the served benchmarks: a plan, and one person on it per name, each with a personal API key made the
way a person makes one (sign in at /login, then /account's form), so that each runs as their own fair-share
tenant (`user:<id>`), not as a key of their own. The admin's side goes through the admin API with the password
the server was started with (APPLIANCE_ADMIN_PASSWORD)."""

from __future__ import annotations

import re

import httpx

PASSWORD = "a bench person's long password"
_FORM_TOKEN = re.compile(r'name="csrf_token" value="([^"]+)"')
_NEW_KEY = re.compile(r'<code class="new-key">([^<]+)</code>')


def people_keys(url: str, admin_password: str, names: list[str], plan: str = "bench plan") -> dict[str, str]:
    """name -> the personal key of a new person of that name, everyone on one new plan without limits."""
    with httpx.Client(base_url=url, auth=("admin", admin_password), timeout=60) as admin:
        made = admin.post("/admin/api/plans", json={"name": plan})
        made.raise_for_status()
        plan_id = made.json()["id"]
        for name in names:
            admin.post(
                "/admin/api/users", json={"username": name, "password": PASSWORD, "role": "user", "plan_id": plan_id}
            ).raise_for_status()
    return {name: _personal_key(url, name) for name in names}


def _personal_key(url: str, name: str) -> str:
    with httpx.Client(base_url=url, timeout=60) as browser:  # keeps the session cookie as a browser does
        form = _FORM_TOKEN.search(browser.get("/login").text)
        if form is None:
            raise RuntimeError("the sign-in page carries no form token")
        signed_in = browser.post("/login", data={"username": name, "password": PASSWORD, "csrf_token": form.group(1)})
        if signed_in.status_code != 303:  # a refused sign-in answers the form again
            raise RuntimeError(f"{name} could not sign in: {signed_in.status_code}")
        account = _FORM_TOKEN.search(browser.get("/account").text)
        if account is None:
            raise RuntimeError(f"{name}'s account page carries no form token (not signed in?)")
        page = browser.post("/account/keys", data={"name": "bench", "csrf_token": account.group(1)})
        page.raise_for_status()
        key = _NEW_KEY.search(page.text)
        if key is None:
            raise RuntimeError(f"{name}'s account page shows no new key")
        return key.group(1)
