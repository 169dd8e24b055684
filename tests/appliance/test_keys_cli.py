"""`appliance keys` on the database, without a server: the key is printed once and stored hashed, limits
round-trip through list, `set` changes only what it is given, `revoke` makes the key fail authentication."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from appliance.database import open_database
from appliance.settings import load_settings
from tests.appliance.conftest import Cli
from web.errors import AuthenticationFailed
from web.keys.info import KeyInfo
from web.keys.service import KeyService


def listed(cli: Cli) -> list[dict[str, Any]]:
    result = cli("keys", "list", "--json")
    assert result.code == 0, result.err
    keys: list[dict[str, Any]] = json.loads(result.out)
    return keys


def authenticate(key: str) -> KeyInfo:
    async def run() -> KeyInfo:
        async with open_database(load_settings()) as db:
            return await KeyService(db.sessions, db.engine).authenticate(key)

    return asyncio.run(run())


def test_create_prints_the_key_once_and_stores_only_its_hash(cli: Cli, data_dir: Path) -> None:
    limits = ("--cap", "256", "--quota", "10_000", "--period", "day", "--concurrency", "2")
    result = cli("keys", "create", "alice", *limits)
    assert result.code == 0, result.err
    key = result.out.strip()
    assert key.startswith("sk-") and "\n" not in key, "stdout is the key alone, for KEY=$(appliance keys create)"
    assert "shown this once" in result.err and "cap 256 tokens/request" in result.err

    assert authenticate(key).name == "alice"
    (entry,) = listed(cli)
    assert key.startswith(entry["prefix"]) and len(entry["prefix"]) < len(key)
    assert entry["id"] == 1 and (entry["max_tokens_per_request"], entry["quota_tokens"]) == (256, 10_000)
    assert (entry["quota_period"], entry["max_concurrent"], entry["revoked_at"]) == ("day", 2, None)
    assert key not in cli("keys", "list").out
    with sqlite3.connect(data_dir / "appliance.db") as db:
        dump = "\n".join(db.iterdump())
    assert key not in dump


def test_set_changes_only_the_limits_given_and_none_lifts_one(cli: Cli) -> None:
    cli("keys", "create", "team", "--cap", "100", "--quota", "5000", "--period", "week", "--concurrency", "3")
    result = cli("keys", "set", "team", "--cap", "none", "--quota", "9000", "--name", "team-a")
    assert result.code == 0, result.err
    assert "team-a" in result.out and "no cap" in result.out
    (entry,) = listed(cli)
    assert entry["name"] == "team-a"
    assert (entry["max_tokens_per_request"], entry["quota_tokens"]) == (None, 9000)
    assert (entry["quota_period"], entry["max_concurrent"]) == ("week", 3), "untouched limits are kept"


def test_revoke_makes_the_key_fail_authentication(cli: Cli) -> None:
    key = cli("keys", "create", "temp").out.strip()
    result = cli("keys", "revoke", "1")
    assert result.code == 0 and "revoked key 1" in result.out
    with pytest.raises(AuthenticationFailed, match="revoked"):
        authenticate(key)
    assert listed(cli)[0]["revoked_at"] is not None
    assert "revoked" in cli("keys", "list").out


def test_a_key_is_named_by_id_or_by_a_unique_name(cli: Cli) -> None:
    cli("keys", "create", "twin")
    cli("keys", "create", "twin")
    ambiguous = cli("keys", "revoke", "twin")
    assert ambiguous.code == 1 and "2 keys are named 'twin' (ids 1, 2): give the id" in ambiguous.err
    missing = cli("keys", "set", "7", "--cap", "5")
    assert missing.code == 1 and "no key with id '7'" in missing.err
    assert [k["revoked_at"] for k in listed(cli)] == [None, None], "nothing changed"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--cap", "0"], "argument --cap: expected a positive integer or 'none', not '0'"),
        (["--quota", "lots"], "argument --quota: expected a positive integer or 'none', not 'lots'"),
        (["--period", "year"], "argument --period: invalid choice: 'year'"),
    ],
)
def test_bad_limits_are_refused_before_the_database_is_touched(
    cli: Cli, data_dir: Path, args: list[str], complaint: str
) -> None:
    result = cli("keys", "create", "x", *args)
    assert result.code == 2 and complaint in result.err
    assert not data_dir.exists()


def test_list_without_keys_says_how_to_make_one(cli: Cli) -> None:
    assert "appliance keys create NAME" in cli("keys", "list").out


def test_front_end_flags_round_trip_and_end_users_are_listed(cli: Cli) -> None:
    """`--front-end [--end-user-plan N] [--accounts]` on create and set; `keys end-users KEY` lists who it named."""
    assert cli("keys", "create", "webui", "--front-end").code == 0
    (entry,) = listed(cli)
    assert (entry["front_end"], entry["front_end_accounts"], entry["front_end_plan_id"]) == (True, False, None)
    missing = cli("keys", "set", "webui", "--end-user-plan", "7")
    assert missing.code != 0 and "no plan with id 7" in missing.err
    changed = cli("keys", "set", "webui", "--accounts", "--quota", "100")
    assert changed.code == 0, changed.err
    assert "front end: each end user under the key's limits, accounts matched" in changed.out
    (entry,) = listed(cli)
    assert (entry["front_end"], entry["front_end_accounts"], entry["quota_tokens"]) == (True, True, 100)
    assert cli("keys", "set", "webui", "--no-front-end").code == 0
    assert listed(cli)[0]["front_end"] is False
    none_yet = cli("keys", "end-users", "webui")
    assert none_yet.code == 0 and "no end users yet" in none_yet.out
    as_json = cli("keys", "end-users", "webui", "--json")
    assert as_json.code == 0 and json.loads(as_json.out) == []
