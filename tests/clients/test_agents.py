"""OpenAI's Codex CLI and Claude Code, installed from npm and run as their users run them (`codex exec`,
`claude -p` in its default session), against a served model: each test checks what the client printed against
the text the server sent (the history keeps it), not only that requests were answered."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.clients.conftest import MAX_OUTPUT_TOKENS, Agents
from tests.web.server import Server

MODEL = "random:tiny-long"
ASK = "Say hello in one word."
RUN_TIMEOUT_S = 300


def _words(text: str) -> str:
    """Text with its whitespace runs folded (a terminal client re-wraps and indents what it prints)."""
    return " ".join(text.split())


def _run(command: list[str], home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """A client in an empty working directory, with a home of its own (no user config, nothing remembered)."""
    work = home / "work"
    work.mkdir(parents=True, exist_ok=True)
    clean = {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **env}
    return subprocess.run(
        command, cwd=work, env=clean, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, stdin=subprocess.DEVNULL
    )


def test_codex_exec_speaks_the_responses_api_and_prints_the_served_text(
    agents: Agents, long_context_server: Server, tmp_path: Path
) -> None:
    server = long_context_server
    key, key_id = server.new_key_and_id("codex")
    codex_home = tmp_path / "codex"
    codex_home.mkdir()
    # The README's configuration, pointed at this server.
    (codex_home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "appliance"\n\n[model_providers.appliance]\nname = "LLM appliance"\n'
        f'base_url = "{server.url}/v1"\nwire_api = "responses"\nenv_key = "APPLIANCE_API_KEY"\n'
    )
    done = _run(
        [str(agents.codex), "exec", "--skip-git-repo-check", ASK],
        tmp_path,
        CODEX_HOME=str(codex_home),
        APPLIANCE_API_KEY=key,
    )
    printed = done.stdout + done.stderr
    (row,) = server.history(key_id=key_id)  # one turn, one request: no retries
    assert (row["endpoint"], row["stream"], row["status"]) == ("responses", True, "finished"), row
    assert row["prompt_tokens"] > 2048, row  # Codex's instructions and tools: past random:tiny's whole context
    assert ASK in row["prompt_text"]
    # The answer ran to the server's default length (the random model never ends it); Codex showed every word of
    # it, then said why it stopped, from the response.incomplete event.
    assert row["completion_tokens"] == MAX_OUTPUT_TOKENS and row["finish_reason"] == "length", row
    assert _words(row["response_text"]) in _words(printed), printed[-3000:]
    assert "Incomplete response returned, reason: max_output_tokens" in printed, printed[-3000:]


def test_claude_code_default_session_runs_its_turns_and_prints_the_served_text(
    agents: Agents, long_context_server: Server, tmp_path: Path
) -> None:
    server = long_context_server
    key, key_id = server.new_key_and_id("claude-code")
    done = _run(
        [str(agents.claude), "-p", ASK, "--output-format", "stream-json", "--verbose"],
        tmp_path,
        ANTHROPIC_BASE_URL=server.url,
        ANTHROPIC_API_KEY=key,
        ANTHROPIC_MODEL=MODEL,
        ANTHROPIC_DEFAULT_HAIKU_MODEL=MODEL,
        CLAUDE_CODE_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT_TOKENS),
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_AUTOUPDATER="1",
    )
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events and events[0]["type"] == "system", (done.stdout[-2000:], done.stderr[-2000:])
    shown = [_text(e["message"]) for e in events if e["type"] == "assistant" and e["message"]["model"] == MODEL]
    rows = list(reversed(server.history(key_id=key_id)))  # oldest first
    assert rows and all(r["endpoint"] == "messages" and r["status"] == "finished" for r in rows), rows
    # Its default session: a system prompt and a system turn inside `messages` (the environment), a long prompt.
    first = json.loads(rows[0]["prompt_text"])
    assert [m["role"] for m in first].count("system") >= 2 and ASK in rows[0]["prompt_text"]
    assert rows[0]["prompt_tokens"] > 2048
    # Each answer stopped at the output limit Claude Code asked for; it showed each one, word for word, and asked
    # for the rest (the next request carries the previous answer).
    assert all(r["max_tokens_requested"] == MAX_OUTPUT_TOKENS and r["finish_reason"] == "length" for r in rows)
    assert [_words(t) for t in shown] == [_words(r["response_text"]) for r in rows], (shown, rows)
    assert events[-1]["type"] == "result", events[-1]


def _text(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["content"] if part.get("type") == "text")
