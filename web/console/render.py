"""Rendering for the pages: the Jinja environment (autoescaped, strict) with its display filters, and the rule
that one route answers with the full page or, when htmx targets one element, only that element's partial."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape
from litestar import Request, Response
from litestar.exceptions import HTTPException
from litestar.plugins.htmx import HTMXRequest, HTMXTemplate
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Template
from litestar.template import TemplateConfig

from web.errors import AppError

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
PARTIALS = "console/partials"

# Pages render untrusted text (prompts, output, key names) only through autoescaped templates and DOM text;
# this policy is the second wall: no inline script, no eval, no third-party origin.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
PRIVATE_HEADERS = {"Cache-Control": "no-store", "Vary": "HX-Request, HX-Target"}


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "–"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{seconds / 60:.1f} min"


def fmt_pct(fraction: float | None, digits: int = 0) -> str:
    return "–" if fraction is None else f"{fraction * 100:.{digits}f}%"


def fmt_num(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def fmt_time(value: datetime | None) -> str:
    return "–" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    env = Environment(
        loader=FileSystemLoader(TEMPLATES_DIR),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(bytes=fmt_bytes, duration=fmt_duration, pct=fmt_pct, num=fmt_num, when=fmt_time)
    return TemplateConfig(engine=JinjaTemplateEngine.from_environment(env))


def wanted_partial(request: HTMXRequest, partials: Collection[str]) -> str | None:
    """The element htmx wants re-rendered, if it is one of this page's partials; None means the full page
    (a plain visit, or htmx restoring a page from its history)."""
    htmx = request.htmx
    if not htmx or htmx.history_restore_request or htmx.boosted:
        return None
    target = htmx.target
    return target if target in partials else None


def render(
    template: str,
    context: Mapping[str, Any],
    *,
    partial: str | None = None,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> HTMXTemplate:
    """The page `template`, or `console/partials/<partial>.html`: the partial named after the element it replaces."""
    name = f"{PARTIALS}/{partial}.html" if partial else template
    return HTMXTemplate(
        template_name=name,
        context=dict(context),
        status_code=status_code,
        headers={**PRIVATE_HEADERS, **(headers or {})},
    )


def fragment(partial: str, context: Mapping[str, Any], *, status_code: int = 200) -> HTMXTemplate:
    """Only the partial: for routes that exist to replace one element (an edit form, a key's card)."""
    return render("", context, partial=partial, status_code=status_code)


def error_page(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    """A refusal inside the console as a page (or plain text for htmx), not the API's JSON error."""
    if isinstance(exc, AppError):
        status, message = exc.status_code, exc.message
    elif isinstance(exc, HTTPException):
        status, message = exc.status_code, str(exc.detail)
    else:
        raise exc
    # The routers' response_headers reach handlers' responses only, not those of exception handlers.
    headers = {**PAGE_HEADERS, **PRIVATE_HEADERS}
    if request.headers.get("hx-request") == "true":
        return Response(message, status_code=status, media_type="text/plain", headers=headers)
    titles = {400: "Bad request", 404: "Not found", 409: "Conflict", 429: "Too many requests"}
    context = {"status": status, "title": titles.get(status, "Refused"), "message": message, "back": "/admin"}
    return Template(template_name="error.html", context=context, status_code=status, headers=headers)
