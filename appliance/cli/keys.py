"""`appliance keys create|list|revoke|set|end-users`: API keys and their limits, straight on the database through web's
KeyService (the server need not run; a running one sees every change at its next request)."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from datetime import datetime
from typing import Any

from appliance.cli import key_front_ends as fe
from appliance.database import Database, with_database
from appliance.settings import Settings
from web.keys.info import MAX_WEIGHT, MIN_WEIGHT, PRIORITIES, KeyInfo, KeyLimits
from web.keys.periods import PERIODS
from web.keys.service import KeyService
from web.models import KeyUsage

NO_LIMIT = ("none", "unlimited")
# (flag, KeyLimits field, what it limits)
LIMIT_FLAGS = (
    ("--cap", "max_tokens_per_request", "most tokens one request may generate (its max_tokens cap)"),
    ("--quota", "quota_tokens", "tokens (prompt + completion) the key may use per period"),
    ("--concurrency", "max_concurrent", "requests the key may have in flight at once"),
)


def limit_value(text: str) -> int | None:
    """argparse type: a positive integer, or none/unlimited for no limit."""
    if text.lower() in NO_LIMIT:
        return None
    try:
        value = int(text.replace("_", "").replace(",", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'none', not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'none', not {text!r}")
    return value


def weight_value(text: str) -> float:
    """argparse type: the key's share against other busy keys, within KeyLimits' bounds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number such as 1, 0.5 or 4, not {text!r}") from None
    if not MIN_WEIGHT <= value <= MAX_WEIGHT:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"expected a weight from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}, not {text!r}")
    return value


def add_parsers(commands: Any) -> None:
    keys = commands.add_parser("keys", help="create, list, revoke and change API keys (on the database)")
    actions = keys.add_subparsers(dest="keys_command", required=True, metavar="{create,list,revoke,set,end-users}")

    create = actions.add_parser("create", help="create a key; it is printed once, on stdout, and never again")
    create.add_argument("name", help="who or what the key is for")
    _add_limit_flags(create, default_none=True)
    fe.add_flags(create, create=True)
    create.add_argument("--json", action="store_true", help="print the key and its settings as JSON")

    listing = actions.add_parser("list", help="every key with its limits and usage in the current period")
    listing.add_argument("--json", action="store_true", help="print JSON")

    revoke = actions.add_parser("revoke", help="revoke a key: its next request gets 401")
    revoke.add_argument("key", help="the key's id, or its name when only one key has it")

    update = actions.add_parser("set", help="change a key's name or limits; options left out keep their value")
    update.add_argument("key", help="the key's id, or its name when only one key has it")
    update.add_argument("--name", help="a new name")
    _add_limit_flags(update, default_none=False)
    fe.add_flags(update, create=False)

    named = actions.add_parser("end-users", help="the people a front-end key's requests named, with their usage")
    named.add_argument("key", help="the key's id, or its name when only one key has it")
    named.add_argument("--json", action="store_true", help="print JSON")


def _add_limit_flags(parser: argparse.ArgumentParser, *, default_none: bool) -> None:
    """create: a flag left out means no limit; set: it keeps the key's value (the attribute stays absent)."""
    unset, period_unset = ("no limit", "none") if default_none else ("unchanged", "unchanged")
    for flag, field, what in LIMIT_FLAGS:
        parser.add_argument(
            flag,
            dest=field,
            type=limit_value,
            default=None if default_none else argparse.SUPPRESS,
            metavar="N|none",
            help=f"{what} (default: {unset})",
        )
    parser.add_argument(
        "--period",
        dest="quota_period",
        choices=PERIODS,
        default="none" if default_none else argparse.SUPPRESS,
        help=f"when the quota resets: each UTC day, ISO week, month, or never (default: {period_unset})",
    )
    parser.add_argument(
        "--weight",
        type=weight_value,
        default=1.0 if default_none else argparse.SUPPRESS,
        metavar="W",
        help="share of the engine against other busy keys: 2 gets twice what 1 gets "
        f"(default: {'1' if default_none else 'unchanged'})",
    )
    parser.add_argument(
        "--class",
        dest="priority",
        choices=PRIORITIES,
        default="interactive" if default_none else argparse.SUPPRESS,
        help="interactive requests are admitted before batch ones "
        f"(default: {'interactive' if default_none else 'unchanged'})",
    )


def run(settings: Settings, args: argparse.Namespace) -> None:
    command = args.keys_command
    if command == "create":
        limits = KeyLimits(
            args.max_tokens_per_request,
            args.quota_tokens,
            args.quota_period,
            args.max_concurrent,
            args.weight,
            args.priority,
        )
        front_end = fe.front_end_of(args, None) or fe.FrontEnd()
        info, key = with_database(settings, lambda db: _service(db).create(args.name, limits, front_end=front_end))
        if args.json:
            print(json.dumps({"key": key, "info": key_json(info, None)}, indent=2))
            return
        print(f"created key {info.id} ({info.name}): {describe_limits(info)}", file=sys.stderr)
        print("the key is shown this once; only its prefix is stored readably:", file=sys.stderr)
        print(key)
    elif command == "list":
        rows = with_database(settings, lambda db: _service(db).list_with_usage())
        if args.json:
            print(json.dumps([key_json(info, usage) for info, usage in rows], indent=2))
        else:
            print_table(rows)
    elif command == "revoke":
        info = with_database(settings, lambda db: _revoke(db, args.key))
        print(f"revoked key {info.id} ({info.name}, {info.prefix}…)")
    elif command == "end-users":
        fe.print_end_users(with_database(settings, lambda db: _end_users(db, args.key)), args.json)
    else:
        info = with_database(settings, lambda db: _update(db, args))
        print(f"key {info.id} ({info.name}): {describe_limits(info)}")


def _service(db: Database) -> KeyService:
    return KeyService(db.sessions, db.engine)


async def _find(service: KeyService, ref: str) -> KeyInfo:
    keys = [info for info, _ in await service.list_with_usage()]
    matches = [k for k in keys if (str(k.id) if ref.isdigit() else k.name) == ref]
    if len(matches) == 1:
        return matches[0]
    if matches:
        ids = ", ".join(str(k.id) for k in matches)
        raise LookupError(f"{len(matches)} keys are named {ref!r} (ids {ids}): give the id")
    raise LookupError(f"no key with {'id' if ref.isdigit() else 'name'} {ref!r} (see `appliance keys list`)")


async def _revoke(db: Database, ref: str) -> KeyInfo:
    service = _service(db)
    return await service.revoke((await _find(service, ref)).stored_id)


async def _update(db: Database, args: argparse.Namespace) -> KeyInfo:
    service = _service(db)
    current = await _find(service, args.key)
    limits = KeyLimits(**{f.name: getattr(args, f.name, getattr(current, f.name)) for f in fields(KeyLimits)})
    return await service.update(current.stored_id, args.name, limits, fe.front_end_of(args, current))


async def _end_users(db: Database, ref: str) -> list[fe.EndUserView]:
    return await fe.end_users(db, (await _find(_service(db), ref)).stored_id)


def describe_limits(info: KeyInfo) -> str:
    cap = f"cap {info.max_tokens_per_request:,} tokens/request" if info.max_tokens_per_request else "no cap"
    if info.quota_tokens is None:
        quota = "no quota"
    elif info.quota_period == "none":
        quota = f"quota {info.quota_tokens:,} tokens in all"
    else:
        quota = f"quota {info.quota_tokens:,} tokens per {info.quota_period}"
    concurrency = f"at most {info.max_concurrent} at once" if info.max_concurrent else "no concurrency limit"
    return f"{cap}, {quota}, {concurrency}, weight {info.weight:g} {info.priority}{fe.describe(info)}"


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def key_json(info: KeyInfo, usage: KeyUsage | None) -> dict[str, Any]:
    return {
        "id": info.id,
        "name": info.name,
        "prefix": info.prefix,
        "created_at": _iso(info.created_at),
        "revoked_at": _iso(info.revoked_at),
        "max_tokens_per_request": info.max_tokens_per_request,
        "quota_tokens": info.quota_tokens,
        "quota_period": info.quota_period,
        "max_concurrent": info.max_concurrent,
        "weight": info.weight,
        "priority": info.priority,
        "front_end": info.front_end.enabled,
        "front_end_accounts": info.front_end.accounts,
        "front_end_plan_id": info.front_end.plan_id,
        "used_tokens": usage.used_tokens if usage else 0,
        "period_start": _iso(usage.period_start) if usage else None,
        "total_tokens": usage.total_tokens if usage else 0,
        "total_requests": usage.total_requests if usage else 0,
        "last_used_at": _iso(usage.last_used_at) if usage else None,
    }


def print_table(rows: list[tuple[KeyInfo, KeyUsage | None]]) -> None:
    if not rows:
        print("no keys yet: appliance keys create NAME")
        return
    table = [("ID", "NAME", "PREFIX", "CAP", "QUOTA", "USED", "CONCURRENCY", "SHARE", "REQUESTS", "STATUS")]
    for info, usage in rows:
        quota = "-" if info.quota_tokens is None else f"{info.quota_tokens:,}"
        if info.quota_tokens is not None and info.quota_period != "none":
            quota += f"/{info.quota_period}"
        table.append(
            (
                str(info.id),
                info.name,
                info.prefix + "…",
                "-" if info.max_tokens_per_request is None else f"{info.max_tokens_per_request:,}",
                quota,
                f"{usage.used_tokens if usage else 0:,}",
                "-" if info.max_concurrent is None else str(info.max_concurrent),
                f"{info.weight:g} {info.priority}",
                f"{usage.total_requests if usage else 0:,}",
                "active" if info.revoked_at is None else f"revoked {info.revoked_at:%Y-%m-%d}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
