"""Everything the browser pages add to the app: the chat and console routers, the templates, the static files.
web/app.py calls `pages()` once per app with its session store."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from litestar import Router
from litestar.di import Provide
from litestar.exceptions import HTTPException
from litestar.plugins.htmx import HTMXRequest
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.static_files import create_static_files_router
from litestar.template import TemplateConfig

from web.chat.routes import chat_router
from web.console import dashboard, history, keys, models
from web.console import people as people_page
from web.console import plans as plans_page
from web.console.auth import LOGIN_PATH, ConsoleState, login, login_page, logout
from web.console.render import PAGE_HEADERS, error_page, template_config
from web.errors import AppError
from web.people.guard import EXCEPTION_HANDLERS as SESSION_ERRORS
from web.people.guard import session_guard
from web.people.pages import people_pages
from web.people.sessions import SessionStore
from web.static import STATIC_DIR, VENDOR_DIR
from web.static.assets import ASSETS, is_current

STATIC_FOLDERS = ("css", "js", "vendor")
log = logging.getLogger("web.console")


@dataclass(frozen=True, slots=True)
class Pages:
    route_handlers: list[Router]
    template_config: TemplateConfig[JinjaTemplateEngine]


def pages(web_sessions: SessionStore) -> Pages:
    missing = [a.target for a in ASSETS if not is_current(a, VENDOR_DIR)]
    if missing:
        log.warning(
            "front-end assets missing or not the pinned version (%s): the console needs them; "
            "run `python -m web.static.assets`",
            ", ".join(missing),
        )
    console = ConsoleState()

    def provide_console() -> ConsoleState:
        return console

    common = {
        "request_class": HTMXRequest,
        "response_headers": PAGE_HEADERS,
        "dependencies": {"console": Provide(provide_console, sync_to_thread=False)},
        "include_in_schema": False,
    }
    public = Router(path="/admin", route_handlers=[login_page, login], **common)  # type: ignore[arg-type]
    private = Router(
        path="/admin",
        route_handlers=[
            logout,
            dashboard.dashboard,
            history.history_page,
            history.request_detail,
            history.history_csv,
            keys.keys_page,
            keys.create_key,
            keys.key_card,
            keys.end_users_page,
            keys.edit_key_form,
            keys.update_key,
            keys.revoke_key,
            models.models_page,
            models.serve_model,
            people_page.people_page,
            people_page.create_person,
            people_page.import_people,
            people_page.invite_person,
            people_page.set_role,
            people_page.set_suspended,
            people_page.set_plan,
            people_page.reset_password,
            people_page.sign_out_person,
            people_page.delete_person,
            plans_page.plans_page,
            plans_page.create_plan,
            plans_page.update_plan,
        ],
        guards=[session_guard(web_sessions, LOGIN_PATH, admin_only=True)],
        exception_handlers={
            **SESSION_ERRORS,
            AppError: error_page,
            HTTPException: error_page,
        },
        **common,  # type: ignore[arg-type]
    )
    # Only the asset folders: web/static also holds the fetch script, which is nobody's business.
    static = [
        create_static_files_router(path=f"/static/{folder}", directories=[STATIC_DIR / folder], name=f"static-{folder}")
        for folder in STATIC_FOLDERS
    ]
    people = people_pages(session_guard(web_sessions, "/login"))
    return Pages([chat_router, *people, public, private, *static], template_config())
