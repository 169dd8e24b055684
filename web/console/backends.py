"""/admin/api/backends: the router's snapshot of each backend (the embedded engine, remote servers on the LAN), as
the dashboard's Backends panel shows it, in JSON for the admin's scripts."""

from litestar import Router, get
from litestar.types import Guard

from web import deps
from web.backends.status import BackendStatus


@get("/", sync_to_thread=False)
def list_backends(router: deps.Router) -> list[BackendStatus]:
    return router.statuses()


def backends_api(admin_guard: Guard) -> Router:
    return Router(path="/admin/api/backends", route_handlers=[list_backends], guards=[admin_guard])
