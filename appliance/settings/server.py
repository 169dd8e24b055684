"""The HTTP server's and the box's own settings: where it listens, how long it holds connections, where its data
and database live, how it logs."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from appliance.settings.field import PREFIX, SettingsError, at_least_one, setting
from web.db import redacted_url, sqlite_url

LOG_LEVELS = ("debug", "info", "warning", "error")
# The async drivers the app runs on: SQLAlchemy's asyncio engine needs one.
DATABASE_DRIVERS = ("sqlite+aiosqlite", "postgresql+asyncpg")


def _default_data_dir() -> str:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return str(Path(base) / "llm-appliance")


@dataclass(frozen=True)
class ServerSettings:
    host: str = setting("127.0.0.1", "Address the HTTP server binds to (0.0.0.0 to serve the LAN).")
    port: int = setting(8000, "TCP port of the HTTP server.")
    data_dir: str = setting(
        _default_data_dir,
        "Directory for the database and the converted model cache.",
        default_doc="$XDG_DATA_HOME/llm-appliance",
    )
    drain_timeout: float = setting(30.0, "Seconds in-flight requests may finish after SIGTERM before abort.")
    keep_alive_timeout: int = setting(
        75, "Seconds an idle HTTP connection is kept open; above clients' own idle expiry (httpx: 5 s)."
    )
    request_read_timeout: float = setting(
        30.0, "Seconds a client has to send a whole request (headers and body) once it starts; 408 beyond."
    )
    max_connections: int = setting(
        2048, "Most open HTTP connections; beyond it a new one replaces the oldest idle one, or gets 503."
    )
    history_retention_days: int = setting(30, "Days request history is kept.")
    store_text: bool = setting(False, "Store prompt and response text in the history (off for privacy).")
    log_level: str = setting("info", "Log level: debug, info, warning or error.")
    database_url: str | None = setting(
        None,
        "Database URL: postgresql+asyncpg://user:password@host/db lets several gateways share keys, quotas "
        "and history (the password is never shown).",
        default_doc="the SQLite file appliance.db in the data dir",
        secret=True,
    )
    gateway_id: str | None = setting(
        None,
        "This gateway's name in the history rows it admits, where several share one PostgreSQL: after a crash "
        "it marks only its own rows interrupted. Keep it the same across restarts.",
        default_doc="hostname:port",
    )

    @property
    def database_path(self) -> Path:
        return Path(self.data_dir) / "appliance.db"

    @property
    def database(self) -> str:
        """The database's SQLAlchemy URL: the one set, else the SQLite file in the data dir."""
        return self.database_url or sqlite_url(self.database_path)

    @property
    def model_cache_dir(self) -> Path:
        return Path(self.data_dir) / "models"

    @property
    def local_url(self) -> str:
        """Where a client on this machine reaches the server (a wildcard bind address answers on loopback)."""
        host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"


def check_server(s: ServerSettings) -> None:
    at_least_one(s, "port", "history_retention_days", "keep_alive_timeout", "max_connections")
    if s.port > 65535:
        raise SettingsError(f"{PREFIX}PORT must be at most 65535, not {s.port}")
    if s.request_read_timeout <= 0:
        raise SettingsError(f"{PREFIX}REQUEST_READ_TIMEOUT must be > 0, not {s.request_read_timeout}")
    if s.drain_timeout < 0:
        raise SettingsError(f"{PREFIX}DRAIN_TIMEOUT must be >= 0, not {s.drain_timeout}")
    if s.log_level not in LOG_LEVELS:
        raise SettingsError(f"{PREFIX}LOG_LEVEL must be debug, info, warning or error, not {s.log_level!r}")
    if s.database_url is not None:
        _check_database_url(s.database_url)


def _check_database_url(url: str) -> None:
    """The messages never carry the URL's password."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise SettingsError(f"{PREFIX}DATABASE_URL is not a database URL (dialect+driver://...)") from None
    if parsed.drivername not in DATABASE_DRIVERS:
        raise SettingsError(
            f"{PREFIX}DATABASE_URL must start with one of {', '.join(d + '://' for d in DATABASE_DRIVERS)}, "
            f"not {redacted_url(url)}"
        )
