"""Everything the browser pages add to the app: the chat and console routers, the templates, the static files.
web/app.py calls `pages()` once per app, so each app has its own console sessions."""

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
from web.console.auth import (
    ConsoleState,
    CsrfRejected,
    LoginRequired,
    handle_csrf_rejected,
    handle_login_required,
    login,
    login_page,
    logout,
    session_guard,
)
from web.console.render import PAGE_HEADERS, error_page, template_config
from web.errors import AppError
from web.static import STATIC_DIR, VENDOR_DIR
from web.static.assets import ASSETS, is_current

STATIC_FOLDERS = ("css", "js", "vendor")
log = logging.getLogger("web.console")


@dataclass(frozen=True, slots=True)
class Pages:
    route_handlers: list[Router]
    template_config: TemplateConfig[JinjaTemplateEngine]


def pages() -> Pages:
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
            keys.edit_key_form,
            keys.update_key,
            keys.revoke_key,
            models.models_page,
            models.serve_model,
        ],
        guards=[session_guard(console)],
        exception_handlers={
            LoginRequired: handle_login_required,
            CsrfRejected: handle_csrf_rejected,
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
    return Pages([chat_router, public, private, *static], template_config())
