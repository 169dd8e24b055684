"""A throwaway PostgreSQL server for the tests: Debian's binaries, initdb into a temporary directory, started on
a free loopback port with password authentication, stopped and removed at the end. Importable on its own (the
web suite's conftest uses it when APPLIANCE_TEST_DATABASE_URL=postgres asks for it)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import asyncpg

USER = "appliance"
PASSWORD = "pg-secret-for-tests-7Qx"  # a test asserts it never reaches a log, a page or a command's output
_databases = count(1)


def binaries() -> Path | None:
    """The directory of initdb and pg_ctl: Debian keeps them under /usr/lib/postgresql/N/bin, off PATH."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> list[str]:
    """initdb and postgres refuse to run as root: as root, run them as the postgres user (or nobody)."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"]
    raise RuntimeError("running as root with neither a postgres nor a nobody user to run PostgreSQL as")


@dataclass(frozen=True, slots=True)
class Server:
    host: str
    port: int
    pg_ctl: list[str]  # pg_ctl as the user that owns the cluster, with its data directory

    def stop(self) -> None:
        """Stop it at once, as a crash or a restart of the database would (clients' connections are cut)."""
        subprocess.run([*self.pg_ctl, "-m", "immediate", "-w", "stop"], check=True, capture_output=True)

    def start(self) -> None:
        subprocess.run([*self.pg_ctl, "-w", "start"], check=True, capture_output=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+asyncpg://{USER}:{PASSWORD}@{self.host}:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database on this server; its SQLAlchemy URL."""
        name = f"test_{os.getpid()}_{next(_databases)}"

        async def create() -> None:
            conn = await asyncpg.connect(
                host=self.host, port=self.port, user=USER, password=PASSWORD, database="postgres"
            )
            try:
                await conn.execute(f'CREATE DATABASE "{name}"')
            finally:
                await conn.close()

        # On a thread of its own: the caller may be inside a running event loop (an async test).
        with ThreadPoolExecutor(1) as thread:
            thread.submit(asyncio.run, create()).result()
        return self.url(name)


@contextlib.contextmanager
def running_server() -> Iterator[Server]:
    """Raises LookupError where no PostgreSQL is installed."""
    bindir = binaries()
    if bindir is None:
        raise LookupError("no PostgreSQL binaries (initdb) on this machine: apt-get install postgresql")
    as_user = _run_as()
    with tempfile.TemporaryDirectory(prefix="appliance-pg-") as tmp:
        root = Path(tmp)
        data, sockets, pwfile = root / "data", root / "sockets", root / "pwfile"
        sockets.mkdir()
        pwfile.write_text(PASSWORD + "\n")
        if as_user:
            user = pwd.getpwnam(as_user[2])
            for path in (root, sockets, pwfile):
                os.chown(path, user.pw_uid, user.pw_gid)
        initdb = ["-D", str(data), "-U", USER, f"--pwfile={pwfile}", "-A", "scram-sha-256", "-E", "UTF8", "--no-sync"]
        subprocess.run([*as_user, str(bindir / "initdb"), *initdb], check=True, capture_output=True)
        port = _free_port()
        options = f"-c listen_addresses=127.0.0.1 -p {port} -k {sockets} -c fsync=off -c max_connections=200"
        pg_ctl = [*as_user, str(bindir / "pg_ctl"), "-D", str(data), "-o", options, "-l", str(root / "log")]
        server = Server("127.0.0.1", port, pg_ctl)
        server.start()
        try:
            yield server
        finally:
            subprocess.run([*pg_ctl, "-m", "fast", "-w", "stop"], check=False, capture_output=True)


# APPLIANCE_TEST_DATABASE_URL=postgres runs the web suite on PostgreSQL (one server for the run, one database per
# test's SQLite path), to find what breaks there; tests/postgres holds the ones CI runs.
SWITCH = "APPLIANCE_TEST_DATABASE_URL"
_switched: dict[Path, str] = {}
_servers: list[Server] = []
_stack = contextlib.ExitStack()
atexit.register(_stack.close)


def database_url_for(path: Path) -> str:
    """The SQLite file's URL, or under the switch a PostgreSQL database of its own (the same one for one path)."""
    if os.environ.get(SWITCH) != "postgres":
        return f"sqlite+aiosqlite:///{path}"
    if path not in _switched:
        if not _servers:
            _servers.append(_stack.enter_context(running_server()))
        _switched[path] = _servers[0].new_database()
    return _switched[path]
