"""`appliance serve` as systemd runs it: a real datagram socket bound here is its NOTIFY_SOCKET, the model is
random:tiny. READY=1 comes only once /ready answers 200, WATCHDOG=1 pulses while the engine runs and stops
when the engine process is frozen, STOPPING=1 comes at SIGTERM. Between those, the commands that work beside
a running server: status, keys, admin set-password, doctor's port check. The tests run in file order against
one server, as systemd would see it over its life."""

from __future__ import annotations

import base64
import json
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from appliance.doctor.report import Doctor
from appliance.settings import load_settings
from tests.appliance.conftest import Cli
from tests.web.conftest import ADMIN_PASSWORD
from tests.web.server import Server, start_server

WATCHDOG_USEC = 2_000_000  # pings every second; the engine counts as hung after 5 s of silence


class NotifyListener:
    """The systemd side: a datagram socket in the abstract namespace, every message kept with its arrival."""

    def __init__(self) -> None:
        self.address = f"@appliance-test-{uuid.uuid4().hex[:12]}"
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind("\0" + self.address[1:])
        self.socket.settimeout(0.2)
        self.messages: list[tuple[float, str]] = []
        self._closed = False
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self.socket.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def times(self, line: str, since: float = 0.0) -> list[float]:
        return [at for at, message in list(self.messages) if line in message.splitlines() and at >= since]

    def wait_for(self, line: str, timeout: float, since: float = 0.0) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := self.times(line, since):
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no {line!r} within {timeout} s; got {self.messages[-10:]}")

    def close(self) -> None:
        self._closed = True
        self._thread.join(2)
        self.socket.close()


@dataclass
class Served:
    server: Server
    listener: NotifyListener
    admin_password: str = ADMIN_PASSWORD
    ready_polls: list[tuple[float, int]] = field(default_factory=list)

    @property
    def port(self) -> str:
        return self.server.url.rsplit(":", 1)[1]

    def admin(self, password: str | None = None) -> dict[str, str]:
        credential = base64.b64encode(f"admin:{password or self.admin_password}".encode()).decode()
        return {"authorization": f"Basic {credential}"}

    def engine_process(self) -> psutil.Process:
        children = psutil.Process(self.server.process.pid).children()
        (engine,) = [p for p in children if "engine.process:run_engine_process" in p.cmdline()]
        return engine


def under_systemd(listener: NotifyListener, start: Callable[[], Server]) -> Server:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("NOTIFY_SOCKET", listener.address)
        env.setenv("WATCHDOG_USEC", str(WATCHDOG_USEC))
        env.delenv("WATCHDOG_PID", raising=False)
        return start()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    listener = NotifyListener()
    server = under_systemd(listener, lambda: start_server(tmp_path_factory.mktemp("serve") / "data"))
    try:
        yield Served(server, listener)
    finally:
        server.stop()
        listener.close()


@pytest.fixture
def beside(served: Served, cli: Cli, monkeypatch: pytest.MonkeyPatch) -> Cli:
    """The command line with the running server's data directory and port."""
    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(served.server.data_dir))
    monkeypatch.setenv("APPLIANCE_PORT", served.port)
    return cli


def test_ready_is_sent_only_once_ready_answers_200(served: Served) -> None:
    deadline = time.monotonic() + 600
    while not served.listener.times("READY=1"):
        assert time.monotonic() < deadline, served.server.log()[-3000:]
        assert served.server.process.poll() is None, served.server.log()[-3000:]
        started = time.monotonic()
        try:
            code = httpx.get(served.server.url + "/ready", timeout=5).status_code
        except httpx.TransportError:
            code = 0  # not listening yet
        served.ready_polls.append((started, code))
        time.sleep(0.1)
    ready_at = served.listener.times("READY=1")[0]
    assert httpx.get(served.server.url + "/ready").status_code == 200
    # Every poll that finished answering 503 (or not at all) started before READY=1 was sent.
    assert all(started < ready_at for started, code in served.ready_polls if code != 200)
    statuses = [m for _, m in served.listener.messages if m.startswith("STATUS=")]
    assert any("loading" in m for m in statuses), statuses
    ready_message = next(m for _, m in served.listener.messages if "READY=1" in m)
    assert f"STATUS=serving random:tiny on 127.0.0.1:{served.port}" in ready_message
    time.sleep(1)
    assert len(served.listener.times("READY=1")) == 1


def test_status_reports_the_engine(served: Served, beside: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    without = beside("status")
    assert without.code == 0 and "ready" in without.out and "--password-stdin" in without.out

    result = beside("status", "--password-stdin", stdin=served.admin_password + "\n")
    assert result.code == 0, result.err
    for shown in ("ready", "random:tiny on cpu", "0 running, 0 waiting", "KV cache:", "RAM:", "queue wait:"):
        assert shown in result.out

    monkeypatch.setenv("APPLIANCE_ADMIN_PASSWORD", served.admin_password)
    stats = json.loads(beside("status", "--json").out)
    assert stats["ready"] and stats["engine"]["kv_blocks_total"] > 0

    refused = beside("status", "--password-stdin", stdin="not-the-password\n")
    assert refused.code == 1 and "refused the admin password" in refused.err


def test_keys_from_the_cli_work_on_the_running_server(served: Served, beside: Cli) -> None:
    key = beside("keys", "create", "cli-made", "--cap", "4").out.strip()
    chat = {"model": "random:tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {key}"}
    answer = httpx.post(served.server.url + "/v1/chat/completions", json=chat, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    over_cap = httpx.post(
        served.server.url + "/v1/chat/completions", json={**chat, "max_tokens": 5}, headers=headers, timeout=60
    )
    # The cap set on the command line applies at once: an ask above it runs trimmed to it (the default policy).
    assert over_cap.status_code == 200 and over_cap.headers["x-max-tokens-trimmed-to"] == "4", over_cap.text

    assert beside("keys", "revoke", "cli-made").code == 0
    revoked = httpx.post(served.server.url + "/v1/chat/completions", json=chat, headers=headers)
    assert revoked.status_code == 401 and "revoked" in revoked.text


def test_the_gateway_renders_and_streams_prompts_without_torch(served: Served, beside: Cli) -> None:
    """The gateway's tokenizer is the class the engine's AutoTokenizer chose, loaded without transformers' config
    module: that module imports torch, 2 CPU-seconds of every start for nothing the gateway uses."""
    served.server.wait_ready()
    key = beside("keys", "create", "no-torch").out.strip()
    chat = {"model": "random:tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    answer = httpx.post(
        served.server.url + "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"}, timeout=60
    )
    assert answer.status_code == 200 and "[DONE]" in answer.text, answer.text

    def maps(process: psutil.Process) -> str:
        return Path(f"/proc/{process.pid}/maps").read_text()

    assert "libtorch_cpu" in maps(served.engine_process())  # what the check below looks for, where torch is
    assert "libtorch_cpu" not in maps(psutil.Process(served.server.process.pid))


def test_admin_set_password_takes_effect_on_the_running_server(served: Served, beside: Cli) -> None:
    stats = served.server.url + "/admin/api/stats"
    assert httpx.get(stats, headers=served.admin()).status_code == 200
    result = beside("admin", "set-password", "--password-stdin", stdin="a-new-admin-password\n")
    assert result.code == 0, result.err
    assert httpx.get(stats, headers=served.admin("a-new-admin-password")).status_code == 200
    assert httpx.get(stats, headers=served.admin()).status_code == 401, "the old password no longer works"
    served.admin_password = "a-new-admin-password"


def test_doctor_names_the_running_appliance_on_its_port(served: Served, beside: Cli) -> None:
    finding = Doctor(load_settings()).check_port()
    assert finding.level == "ok"
    assert f"port {served.port} is served by a running appliance (pid {served.server.process.pid}" in finding.message
    assert "ready, serving random:tiny" in finding.message


def test_watchdog_pulses_while_the_engine_runs_and_stops_when_it_hangs(served: Served) -> None:
    listener = served.listener
    window = time.monotonic()
    time.sleep(3.2)
    assert len(listener.times("WATCHDOG=1", since=window)) >= 2

    engine = served.engine_process()
    engine.suspend()  # SIGSTOP: alive, but its loop no longer turns
    frozen = time.monotonic()
    try:
        deadline = frozen + 20
        while True:
            pings = listener.times("WATCHDOG=1", since=frozen)
            last = pings[-1] if pings else frozen
            if time.monotonic() - last > 3.5:
                break
            assert time.monotonic() < deadline, f"the watchdog kept pulsing for a frozen engine: {pings}"
            time.sleep(0.25)
        assert last - frozen <= 5 + 2, "pings stop within the engine's allowed silence"
    finally:
        engine.resume()
    listener.wait_for("WATCHDOG=1", timeout=10, since=time.monotonic())


def test_sigterm_sends_stopping_then_the_server_exits_0(served: Served) -> None:
    process = served.server.process
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    stopping = served.listener.wait_for("STOPPING=1", timeout=10, since=signalled)
    assert process.wait(90) == 0, served.server.log()[-3000:]
    assert stopping - signalled < 5


def test_status_says_so_when_nothing_answers(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, never listening: connecting is refused, and nobody else can take it
        monkeypatch.setenv("APPLIANCE_PORT", str(held.getsockname()[1]))
        result = cli("status")
    assert result.code == 3
    assert "nothing answers at http://127.0.0.1:" in result.err and "not running" in result.err


def test_an_engine_that_cannot_start_under_systemd_exits_non_zero(tmp_path: Path) -> None:
    listener = NotifyListener()
    missing = tmp_path / "missing.gguf"
    server = under_systemd(listener, lambda: start_server(tmp_path / "data", model=str(missing)))
    try:
        assert server.process.wait(300) == 1, server.log()[-3000:]
    finally:
        server.stop()
        listener.close()
    statuses = [m for _, m in listener.messages if m.startswith("STATUS=")]
    assert any("the engine failed to start" in m and "missing.gguf" in m for m in statuses), statuses
    assert not listener.times("READY=1")
