"""Test-wide set-up: one model cache for the whole run, so the bundled model is converted once."""

from __future__ import annotations

import asyncio
import gc
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# Must happen before engine modules read it: the engine's default model cache and the appliance's default data
# directory are both under $XDG_DATA_HOME/llm-appliance.
os.environ.setdefault("XDG_DATA_HOME", str(Path(__file__).resolve().parent.parent / "data" / "test-cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# What compiles must outlive the clone: CI runs `make test` from a fresh clone on the same machine, and vLLM's
# first start compiles (torch inductor) for minutes on two cores; a warm cache halves the start (295 -> 132 s,
# measured). Outside the repo so a new clone finds it; not /tmp (inductor's default), which a reboot empties.
# The inductor cache is keyed by the graphs' code, not by paths; every process the tests start inherits it.
os.environ.setdefault("XDG_CACHE_HOME", str(Path.home() / ".cache"))
os.environ.setdefault("LLM_APPLIANCE_TEST_CACHE", os.path.join(os.environ["XDG_CACHE_HOME"], "llm-appliance-tests"))
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.environ["LLM_APPLIANCE_TEST_CACHE"], "torchinductor"))
os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(os.environ["LLM_APPLIANCE_TEST_CACHE"], "vllm"))

import web.app  # noqa: F401  (every module that hashes passwords, imported before the cache patches them)
from web.db import create_db_engine, sqlite_url, upgrade_schema
from web.people import passwords  # after the environment above

if TYPE_CHECKING:
    from tests.web.server import Server

# The real vLLM server (vllm_model, vllm_server) for any test of the suite.
pytest_plugins = ["tests.peers.vllm"]

TESTS = Path(__file__).resolve().parent
# Folders whose every test starts real processes (servers, a browser, PostgreSQL, an install): `pytest -m "not
# slow"` leaves them out of the edit loop; `make test` and CI run everything.
SLOW_FOLDERS = frozenset({"peers", "install", "browser", "postgres", "robustness", "clients", "people"})
# Fixtures that are real processes: a test that takes one is slow wherever it lives.
VLLM_FIXTURES = frozenset({"vllm_model", "vllm_server"})
REAL_SERVERS = frozenset({"server", "keeping_server", "served", "fleet"}) | VLLM_FIXTURES
# Under pytest-xdist (`pytest -n 2 --dist loadgroup`: not what `make test` runs, see the Makefile) a group runs on
# one worker in file order. A module is a group of its own by default: its tests share its module-scoped servers,
# and some run in order on them (one drains a backend for good). vLLM's tests share one vLLM server, the browser's
# and PostgreSQL's folders their package's or session's server: each is started once, on one worker.
SHARED_GROUPS = {"peers": "vllm", "browser": "browser", "postgres": "postgres"}
VLLM_GROUP = "vllm"
# Where the tests that need vLLM live (the Makefile's VLLM_DIRS collects only these for them: the whole tree takes
# ~15 s to collect).
VLLM_FOLDERS = frozenset({"peers", "backends"})
# In-process suites (the app on the fake engine behind Litestar's test client; no server, no subprocess): pure
# Python on one core, so `make test` runs them in its second lane (`-m beside`, then tests/engine) beside the rest,
# whose real servers, browsers and installs are mostly one core's work (the Makefile says how it was measured).
BESIDE_FOLDERS = frozenset({"security", "web"})


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        fixtures = set(getattr(item, "fixturenames", ()))
        if folder in SLOW_FOLDERS or REAL_SERVERS & fixtures:
            item.add_marker(pytest.mark.slow)
        elif folder in BESIDE_FOLDERS:
            item.add_marker(pytest.mark.beside)
        group = VLLM_GROUP if VLLM_FIXTURES & fixtures else SHARED_GROUPS.get(folder, str(item.path.relative_to(TESTS)))
        item.add_marker(pytest.mark.xdist_group(group))
        if group == VLLM_GROUP:  # needs vLLM's venv: `make test` runs these once `make vllm-env` has made it
            if folder not in VLLM_FOLDERS:
                raise pytest.UsageError(f"{item.nodeid} needs vLLM: add its folder to VLLM_FOLDERS and the Makefile")
            item.add_marker(pytest.mark.vllm)
    # vLLM's group first: its chain (a cold compile, then two managed starts) is the longest, and the other worker
    # takes everything else meanwhile. The sort is stable: every module keeps its order.
    items.sort(key=lambda item: item.get_closest_marker("xdist_group").args[0] != VLLM_GROUP)  # type: ignore[union-attr]


def pytest_collection_finish(session: pytest.Session) -> None:
    """The test process's imports (torch, transformers, Litestar, every test module) live as long as it does:
    frozen, the suite's full collections no longer walk them (in the in-process suites each one took 0.1-0.4 s
    and they added up to an eighth of the run), as the servers freeze theirs (engine.worker, appliance.serve)."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    """Thawed for the interpreter's last collection, as engine.worker does: nanobind reports what stays frozen as
    leaked (triton's bindings, some thirty lines after every run that imported torch's compiler)."""
    gc.unfreeze()


@pytest.fixture(autouse=True, scope="session")
def _scrypt_once_per_password() -> Iterator[list[tuple[Any, str, Any, Any]]]:
    """Every password is hashed and checked at scrypt's full cost (about half a second each, on two cores), and
    the tests sign in and make people with a handful of passwords hundreds of times: compute each distinct hash
    and each verdict once per run. The results are the real functions' (a real N=2^17 hash, a real verdict), so
    what the tests see is unchanged; only a second person with the same password gets the first one's salt.
    Patched wherever web/ bound the names (web/people/passwords.py's callers import them by name), else the
    cache misses them: it did, for sign-ins and new people, once those moved to web/people/."""
    hash_real, verify_real = passwords.hash_password, passwords.verify_password
    hashes: dict[str, str] = {}
    verdicts: dict[tuple[str, str], bool] = {}

    def hash_password(password: str) -> str:
        if password not in hashes:
            hashes[password] = hash_real(password)
        return hashes[password]

    def verify_password(password: str, stored: str) -> bool:
        if (password, stored) not in verdicts:
            verdicts[password, stored] = verify_real(password, stored)
        return verdicts[password, stored]

    patched = [
        (module, name, real, fake)
        for module in list(sys.modules.values())
        if getattr(module, "__name__", "").startswith("web.")
        for name, real, fake in (
            ("hash_password", hash_real, hash_password),
            ("verify_password", verify_real, verify_password),
        )
        if getattr(module, name, None) is real
    ]
    assert {m.__name__ for m, *_ in patched} >= {"web.people.passwords", "web.people.signin", "web.people.accounts"}
    for module, name, _, fake in patched:
        setattr(module, name, fake)
    yield patched
    for module, name, real, _ in patched:
        setattr(module, name, real)


@pytest.fixture
def full_cost_scrypt(
    _scrypt_once_per_password: list[tuple[Any, str, Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real hash and check for one test, each call at full cost: for tests that time them (a cached verdict
    answers in microseconds, whatever the password)."""
    for module, name, real, _ in _scrypt_once_per_password:
        monkeypatch.setattr(module, name, real)


@pytest.fixture
def cheap_new_passwords(
    _scrypt_once_per_password: list[tuple[Any, str, Any, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """For one test that makes a person with a new password at every request (the fuzzer: 50 examples of POST
    /admin/api/users at ~0.4 s of scrypt each): every password is hashed at scrypt's N=2^10, uncached, so the
    run's cache keeps only full-cost hashes. The hashes stay real (the cost is written in each one, and checks
    read it there); the decoy for unknown names is made first, at full cost, since it is made once per process."""
    passwords.nobodys_hash()
    monkeypatch.setattr(passwords, "SCRYPT_N", 1 << 10)
    for module, name, real, _ in _scrypt_once_per_password:
        if name == "hash_password":
            monkeypatch.setattr(module, name, real)


@pytest.fixture(scope="session")
def migrated_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file at the schema's head, migrated once per run (per xdist worker): Alembic over every revision
    costs ~0.12 s, and hundreds of tests (web's, security's fuzzer) each start an app on a database of their own."""
    path = tmp_path_factory.mktemp("migrated") / "appliance.db"

    async def migrate() -> None:
        engine = create_db_engine(sqlite_url(path))
        try:
            await upgrade_schema(engine)
        finally:
            await engine.dispose()  # the last connection checkpoints the WAL: the file alone holds the schema

    asyncio.run(migrate())
    return path


def fresh_database(path: Path, migrated: Path) -> Path:
    """`path` as a copy of the migrated file: the app's start-up still runs `upgrade head` (then a no-op) on it."""
    shutil.copyfile(migrated, path)
    return path


@pytest.fixture
def db_path(tmp_path: Path, migrated_db: Path) -> Path:
    """A database of this test's own, at the schema's head."""
    return fresh_database(tmp_path / "appliance.db", migrated_db)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One real appliance (tests/web/server.py: its own process, random:tiny) for every suite that leaves it
    running (robustness, security's engine boundary, web's real-server and SDK suites): a start costs ~15 s of CI.
    Tests on it never count all rows: each finds its own (by request id, or by a key of its own). A suite that
    needs other settings, or kills or stops its server, starts its own. fp32: tests compare a greedy answer with
    its repeat, which hits the prefix cache; in bf16 (the auto choice on CPUs with native bf16) the cached and the
    cold paths round differently, and a random model's near-tied logits can then pick another token."""
    from tests.web.server import serving  # it imports tests/web/conftest.py, which needs the environment above

    with serving(tmp_path_factory.mktemp("real-server"), dtype="float32") as srv:
        yield srv


@pytest.fixture(scope="session")
def keeping_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The second shared appliance, for what the first does not do: it stores text (so it keeps Responses API
    answers) and serves the bundled embedding model beside random:tiny (the embeddings and Ollama's routes); one
    start for both suites. Its tests find their own rows, as on the first."""
    from tests.web.server import serving

    with serving(tmp_path_factory.mktemp("keeping-server"), dtype="float32", store_text="true",
                 embedding_model="default") as srv:  # fmt: skip
        yield srv
