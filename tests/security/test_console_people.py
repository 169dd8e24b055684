"""The console's People and Plans pages over HTTP in-process, as the admin uses them: make a plan, make a person
on it, import a CSV, make an invite link, approve a sign-up, suspend and restore, set a plan, reset a password,
sign someone out everywhere, and see use against quota; and a person's session is no way into any of it."""

from __future__ import annotations

import re
import sqlite3

from tests.security.conftest import PERSON_PASSWORD, Appliance
from tests.web.conftest import ADMIN, MODEL
from web.console.auth import CSRF_FIELD, CSRF_HEADER


def test_the_admin_runs_people_and_plans_from_the_console(appliance: Appliance) -> None:
    admin = appliance.sign_in()
    form = {CSRF_FIELD: admin.csrf}
    made = appliance.post_form(
        admin,
        "/admin/plans",
        {
            **form,
            "name": "console-plan",
            "quota_tokens": "500",
            "quota_period": "week",
            "weight": "2",
            "priority": "interactive",
            "models": "",
        },
    )
    assert made.status_code == 303, made.text
    plan_id = next(
        p["id"] for p in appliance.http.get("/admin/api/plans", headers=ADMIN).json() if p["name"] == "console-plan"
    )
    created = appliance.post_form(
        admin,
        "/admin/people",
        {**form, "username": "console-made", "password": PERSON_PASSWORD, "role": "user", "plan_id": str(plan_id)},
    )
    assert created.status_code == 303, created.text
    people = {p["username"]: p for p in appliance.http.get("/admin/api/users", headers=ADMIN).json()}
    person = people["console-made"]
    assert person["plan_id"] == plan_id and person["role"] == "user"

    session = appliance.person_signs_in("console-made")
    appliance.http.cookies.clear()
    chat = appliance.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        headers={"Cookie": f"appliance_session={session.cookie}", CSRF_HEADER: session.csrf},
    )
    assert chat.status_code == 200
    appliance.flush_history()
    page = appliance.page(admin, "/admin/people").text
    row = page[page.index('id="person-' + str(person["id"])) :]
    row = row[: row.index("</article>")]
    used = re.search(r"(\d+) tokens used\s+of 500 this week", row)
    assert used and int(used.group(1)) > 0, row
    assert "console-plan" in row

    imported = appliance.post_form(
        admin, "/admin/people/import", {**form, "csv": f"username,password\ncsv-console,{PERSON_PASSWORD}\nbad,short\n"}
    )
    assert imported.status_code == 201 and "csv-console" in imported.text and "line 3" in imported.text
    invited = appliance.post_form(admin, "/admin/people/invite", {**form, "role": "user", "plan_id": ""})
    link = re.search(r'id="invite-link" class="secret" readonly value="([^"]+)"', invited.text)
    assert invited.status_code == 201 and link and "/invite/" in link.group(1)
    appliance.http.cookies.clear()
    assert appliance.http.get(link.group(1).split("appliance.local", 1)[1]).status_code == 200

    pending = appliance.new_person("console-pending", role="pending")
    htmx = {CSRF_HEADER: admin.csrf, "HX-Request": "true"}
    approved = appliance.post_form(admin, f"/admin/people/{pending}/role", {"role": "user"}, **htmx)
    assert approved.status_code == 200 and "Approve" not in approved.text and ">user<" in approved.text
    suspended = appliance.post_form(admin, f"/admin/people/{person['id']}/suspend", {"suspended": "1"}, **htmx)
    assert suspended.status_code == 200 and "suspended" in suspended.text and "Restore" in suspended.text
    appliance.post_form(admin, f"/admin/people/{person['id']}/suspend", {"suspended": "0"}, **htmx)
    session = appliance.person_signs_in("console-made")
    assert appliance.post_form(admin, f"/admin/people/{person['id']}/plan", {"plan_id": ""}, **htmx).status_code == 200
    short = appliance.post_form(admin, f"/admin/people/{person['id']}/password", {"password": "short"}, **htmx)
    assert short.status_code == 422 and "8 characters" in short.text
    reset = appliance.post_form(
        admin, f"/admin/people/{person['id']}/password", {"password": "a new long one!"}, **htmx
    )
    assert reset.status_code == 200
    assert appliance.page(session, "/account").status_code == 303, "a new password signs the person out"
    assert appliance.person_signs_in("console-made", "a new long one!")
    with sqlite3.connect(appliance.db_path) as db:
        (plan_now,) = db.execute("SELECT plan_id FROM users WHERE id = ?", (person["id"],)).fetchone()
    assert plan_now is None
    unknown = appliance.post_form(admin, "/admin/people/999999/suspend", {"suspended": "1"}, **htmx)
    assert unknown.status_code == 404

    person_session = appliance.person_signs_in("console-made", "a new long one!")
    for path in ("/admin/people", "/admin/plans"):
        assert appliance.page(person_session, path).status_code == 303
    refused = appliance.post_form(
        person_session, f"/admin/people/{person['id']}/role", {"role": "admin", CSRF_FIELD: person_session.csrf}
    )
    assert refused.status_code == 303 and refused.headers["location"].startswith("/admin/login")
    assert appliance.http.get(f"/admin/api/users/{person['id']}", headers=ADMIN).json()["role"] == "user"


def test_the_admin_deletes_a_person_from_the_console_but_never_the_last_admin(appliance: Appliance) -> None:
    admin = appliance.sign_in()
    htmx = {CSRF_HEADER: admin.csrf, "HX-Request": "true"}
    gone = appliance.new_person("console-gone")
    session = appliance.person_signs_in("console-gone")
    row = appliance.page(admin, "/admin/people").text
    assert f'action="/admin/people/{gone}/delete"' in row and "hx-confirm" in row

    deleted = appliance.post_form(admin, f"/admin/people/{gone}/delete", {}, **htmx)
    assert deleted.status_code == 200 and deleted.text == ""  # htmx swaps the row out
    assert appliance.http.get(f"/admin/api/users/{gone}", headers=ADMIN).status_code == 404
    assert appliance.page(session, "/account").status_code == 303, "their session went with them"
    assert appliance.post_form(admin, f"/admin/people/{gone}/delete", {}, **htmx).status_code == 404

    admins = [p for p in appliance.http.get("/admin/api/users", headers=ADMIN).json() if p["role"] == "admin"]
    assert len(admins) == 1, "this test needs the admin to be the only one"
    kept = appliance.post_form(admin, f"/admin/people/{admins[0]['id']}/delete", {}, **htmx)
    assert kept.status_code == 422 and "last active admin" in kept.text
    assert appliance.http.get(f"/admin/api/users/{admins[0]['id']}", headers=ADMIN).status_code == 200
    without_csrf = appliance.post_form(admin, f"/admin/people/{appliance.new_person('console-kept')}/delete", {})
    assert without_csrf.status_code == 403
