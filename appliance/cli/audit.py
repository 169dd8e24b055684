"""`appliance audit export|verify`: the request history as a hash-chained JSON Lines file kept as the record of AI
use (web/audit/), straight from the database (the server need not run); `verify` checks a file anywhere."""

from __future__ import annotations

import argparse
import socket
import sys
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from appliance.database import database_place, with_database
from appliance.settings import Settings
from web.audit.chain import ChainBroken, verify
from web.audit.export import Exported, export

PACKAGE = "llm-appliance"


def since_value(text: str) -> datetime:
    """argparse type: an ISO 8601 date or time; one without a zone is UTC."""
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 date or time (2026-01-31), not {text!r}") from None
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def add_parsers(commands: Any) -> None:
    audit = commands.add_parser("audit", help="export the request history as a hash-chained audit file, verify one")
    actions = audit.add_subparsers(dest="audit_command", required=True, metavar="{export,verify}")
    exporting = actions.add_parser(
        "export", help="create FILE or append the requests that ended since its last line (run it nightly)"
    )
    exporting.add_argument("file", type=Path, help="the audit file (JSON Lines); an existing one must verify")
    exporting.add_argument("--since", type=since_value, help="only requests that arrived from then on (ISO 8601)")
    checking = actions.add_parser("verify", help="check FILE's chain; exit 1 naming the first bad line")
    checking.add_argument("file", type=Path, help="the audit file")


def run(settings: Settings, args: argparse.Namespace) -> int:
    try:
        if args.audit_command == "verify":
            end = verify(args.file)
            print(f"{args.file}: intact, {end.lines} lines; last line {end.seq} has hash {end.hash}")
            return 0
        appliance = _appliance(settings)
        done = with_database(settings, lambda db: export(db.engine, args.file, appliance, args.since))
    except ChainBroken as exc:
        nothing = "; nothing was appended" if args.audit_command == "export" else ""
        print(f"appliance: {exc}{nothing}", file=sys.stderr)
        return 1
    except BlockingIOError:
        print(f"appliance: another export is writing {args.file}; nothing was appended", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"appliance: {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    _report(args.file, done)
    return 0


def _appliance(settings: Settings) -> dict[str, Any]:
    """Which appliance wrote the lines: for an auditor holding files from several."""
    gateway = settings.gateway_id or f"{socket.gethostname()}:{settings.port}"
    return {"software": PACKAGE, "version": version(PACKAGE), "gateway": gateway, "database": database_place(settings)}


def _report(path: Path, done: Exported) -> None:
    print(f"{path}: {done.rows} requests appended; {done.end.lines} lines, last hash {done.end.hash}")
    later = f"requests that arrived from {done.horizon.isoformat(timespec='seconds')} on go in the next export"
    if done.held_by is not None:
        later += f" (request {done.held_by} is still in flight)"
    print(later, file=sys.stderr)
