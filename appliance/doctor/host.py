"""`appliance doctor`'s checks of the machine around the model: the data directory, the database schema, the
port, the disk and the vendored front-end assets. Each returns one Finding; appliance/doctor/report.py runs them
after the GPU, memory and model checks."""

from __future__ import annotations

import errno
import getpass
import shutil
import socket
import tempfile
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from appliance.database import database_place, schema_revision
from appliance.doctor.probes import listener, nearest_existing, probe_appliance
from appliance.settings import Settings
from web.console.render import fmt_bytes
from web.history.writer import describe as describe_db_error
from web.static import VENDOR_DIR
from web.static.assets import ASSETS, is_current

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
DISK_WARN_BYTES = 5 << 30  # a converted 8B model alone takes about 16 GB
DISK_FAIL_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Finding:
    level: str  # ok | info (nothing to do, e.g. skipped) | warn (works, but look) | fail
    check: str
    message: str

    def line(self) -> str:
        return f"{self.level:<5} {self.check:<13} {self.message}"


class HostChecks:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def check_data_dir(self) -> Finding:
        path = Path(self.settings.data_dir)
        existing = nearest_existing(path)
        if not existing.is_dir():
            return Finding(FAIL, "data dir", f"{existing} is not a directory, so {path} cannot be created")
        try:
            with tempfile.NamedTemporaryFile(dir=existing, prefix=".doctor-"):
                pass
        except OSError as exc:
            return Finding(
                FAIL,
                "data dir",
                f"{existing} is not writable by {getpass.getuser()}: {exc.strerror} "
                "(run doctor as the service's user: sudo -u appliance ...)",
            )
        if existing != path:
            return Finding(OK, "data dir", f"{path} does not exist yet; it will be created under {existing}")
        return Finding(OK, "data dir", f"{path} is writable")

    def check_database(self) -> Finding:
        path = database_place(self.settings)
        try:
            revision = schema_revision(self.settings)
        except (SQLAlchemyError, OSError) as exc:  # asyncpg raises a refused connect as an OSError
            return Finding(FAIL, "database", f"cannot read {path}: {describe_db_error(exc)}")
        if self.settings.database_url is None and not self.settings.database_path.is_file():
            return Finding(
                WARN,
                "database",
                f"none yet at {path}: `appliance migrate` creates it (the server also does at its first start)",
            )
        if revision.current == revision.head:
            return Finding(OK, "database", f"{path} is at the latest schema ({revision.head})")
        if not revision.known:
            return Finding(
                FAIL,
                "database",
                f"{path} is at revision {revision.current}, unknown to this version (written by a newer appliance?)",
            )
        now = revision.current or "no revision"
        return Finding(FAIL, "database", f"{path} is at {now}, the latest is {revision.head}: run `appliance migrate`")

    # -- port and disk ------------------------------------------------------------------------------------

    @cached_property
    def port_state(self) -> tuple[str, str]:
        """("free" | "appliance" | "taken" | "error", details)."""
        host, port = self.settings.host, self.settings.port
        try:
            family, kind, proto, _, address = socket.getaddrinfo(
                host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
                probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return self._port_owner()
            if exc.errno == errno.EACCES:
                return "error", f"port {port} needs privileges: choose APPLIANCE_PORT 1024 or above"
            return "error", f"cannot bind {host}:{port}: {exc.strerror or exc} (is {host} an address of this machine?)"
        return "free", f"{host}:{port} is free"

    def _port_owner(self) -> tuple[str, str]:
        port = self.settings.port
        owner = listener(port)
        ready = probe_appliance(self.settings.local_url)
        if ready is not None:
            return "appliance", f"port {port} is served by a running appliance{owner}: {ready}"
        return (
            "taken",
            f"port {port} is taken by another program{owner or ' (ss -ltnp names it)'}: choose another APPLIANCE_PORT",
        )

    @property
    def appliance_running(self) -> bool:
        return self.port_state[0] == "appliance"

    def check_port(self) -> Finding:
        state, details = self.port_state
        return Finding({"free": OK, "appliance": OK}.get(state, FAIL), "port", details)

    def check_disk(self) -> Finding:
        where = nearest_existing(Path(self.settings.data_dir))
        usage = shutil.disk_usage(where)
        summary = f"{fmt_bytes(usage.free)} free of {fmt_bytes(usage.total)} where {self.settings.data_dir} lives"
        if usage.free < DISK_FAIL_BYTES:
            return Finding(FAIL, "disk", f"{summary}: too little for the database and the model cache")
        if usage.free < DISK_WARN_BYTES:
            return Finding(WARN, "disk", f"{summary}: a converted model takes about 2 GB per billion parameters")
        return Finding(OK, "disk", summary)

    # -- front-end assets ---------------------------------------------------------------------------------

    def check_assets(self) -> Finding:
        """The pinned third-party files the pages load (web/static/assets.py): present, with the pinned hash."""
        missing = [a for a in ASSETS if not (VENDOR_DIR / a.target).is_file()]
        changed = [a for a in ASSETS if a not in missing and not is_current(a, VENDOR_DIR)]
        if not missing and not changed:
            pinned = ", ".join(sorted({f"{a.package} {a.version}" for a in ASSETS}))
            return Finding(OK, "assets", f"{len(ASSETS)} front-end files at their pinned sha256 ({pinned})")
        problems = [f"{VENDOR_DIR / a.target} is missing" for a in missing]
        problems += [f"{VENDOR_DIR / a.target} is not {a.package} {a.version} (sha256 differs)" for a in changed]
        return Finding(FAIL, "assets", f"{'; '.join(problems)}: run `appliance assets fetch` (needs npm)")
