"""The front-end part of `appliance keys`: the flags that make a key a trusted front end (Open WebUI and the
like, whose requests name their end users), and `appliance keys end-users KEY`, the people its requests named."""

from __future__ import annotations

import argparse
import json

import msgspec

from appliance.database import Database
from web.keys.front_end import FrontEnds
from web.keys.info import FrontEnd, KeyInfo
from web.keys.schemas import EndUserView
from web.people.plans import Plans


def plan_value(text: str) -> int | None:
    """argparse type: a plan's id, or none for the key's own limits."""
    if text.lower() == "none":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a plan id or 'none', not {text!r}")
    return int(text)


def add_flags(parser: argparse.ArgumentParser, *, create: bool) -> None:
    """create: a flag left out means not a front end; set: it keeps the key's value."""
    unset = argparse.SUPPRESS if not create else None
    parser.add_argument(
        "--front-end",
        dest="front_end",
        action="store_true" if create else argparse.BooleanOptionalAction,
        default=False if create else unset,
        help="a trusted front end: each request may name its end user (X-OpenWebUI-User-Id, "
        "X-OpenWebUI-User-Email, or the body's user), who is then a tenant with a quota of their own",
    )
    parser.add_argument(
        "--end-user-plan",
        dest="front_end_plan_id",
        type=plan_value,
        default=None if create else unset,
        metavar="PLAN_ID|none",
        help="the plan each end user runs under (default: the key's own limits, for each end user)",
    )
    parser.add_argument(
        "--accounts",
        dest="front_end_accounts",
        action="store_true" if create else argparse.BooleanOptionalAction,
        default=False if create else unset,
        help="the first name a request gives that is an account's user name runs as that person (never an admin)",
    )


def front_end_of(args: argparse.Namespace, current: KeyInfo | None) -> FrontEnd | None:
    """The settings the flags give; None where `set` was given none of them."""
    names = ("front_end", "front_end_accounts", "front_end_plan_id")
    if current is not None and not any(hasattr(args, n) for n in names):
        return None
    now = current.front_end if current is not None else FrontEnd()
    return FrontEnd(
        getattr(args, "front_end", now.enabled),
        getattr(args, "front_end_accounts", now.accounts),
        getattr(args, "front_end_plan_id", now.plan_id),
    )


def describe(info: KeyInfo) -> str:
    if not info.front_end.enabled:
        return ""
    plan = "the key's limits" if info.front_end.plan_id is None else f"plan {info.front_end.plan_id}"
    accounts = ", accounts matched" if info.front_end.accounts else ""
    return f"; front end: each end user under {plan}{accounts}"


async def end_users(db: Database, key_id: int) -> list[EndUserView]:
    return await FrontEnds(db.sessions, Plans(db.sessions)).end_users(key_id)


def print_end_users(rows: list[EndUserView], as_json: bool) -> None:
    if as_json:
        print(json.dumps(msgspec.to_builtins(rows), indent=2))
        return
    if not rows:
        print("no end users yet: a front-end key's requests name them (see README, Open WebUI)")
        return
    table: list[tuple[str, ...]] = [("ID", "NAME", "PLAN", "USED", "TOTAL", "REQUESTS", "LAST SEEN")]
    for r in rows:
        seen = r.last_used_at
        table.append(
            (
                str(r.id),
                r.name,
                "-" if r.plan_id is None else str(r.plan_id),
                f"{r.used_tokens:,}",
                f"{r.total_tokens:,}",
                f"{r.total_requests:,}",
                "-" if seen is None else f"{seen:%Y-%m-%d %H:%M}",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    for row in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
