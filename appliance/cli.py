"""The `appliance` command: serve, migrate, settings (the table for the README), set-admin-password."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys

from appliance.settings import Settings, SettingsError, load_settings, settings_table
from engine import ConfigError
from web.errors import AppError


def _migrate(settings: Settings) -> None:
    from web.db import create_db_engine, sqlite_url, upgrade_schema

    async def run() -> None:
        settings.database_path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_db_engine(sqlite_url(settings.database_path))
        try:
            await upgrade_schema(engine)
        finally:
            await engine.dispose()

    asyncio.run(run())
    print(f"database at {settings.database_path} is at the latest schema")


def _set_admin_password(settings: Settings) -> None:
    from web.db import create_db_engine, create_sessionmaker, sqlite_url, upgrade_schema
    from web.system.admin_auth import AdminAuth

    if sys.stdin.isatty():
        password = getpass.getpass("new admin password: ")
        if getpass.getpass("again: ") != password:
            raise SystemExit("the passwords differ")
    else:
        password = sys.stdin.readline().rstrip("\n")

    async def run() -> None:
        settings.database_path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_db_engine(sqlite_url(settings.database_path))
        try:
            await upgrade_schema(engine)
            await AdminAuth(create_sessionmaker(engine), None).set_password(password)
        finally:
            await engine.dispose()

    asyncio.run(run())
    print("admin password updated")


def _print_settings() -> None:
    print("| Variable | Type | Default | Description |")
    print("|---|---|---|---|")
    for row in settings_table():
        print(f"| `{row.variable}` | {row.type} | `{row.default}` | {row.description} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="appliance", description="The edge LLM serving appliance.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="serve the OpenAI-compatible API (settings from APPLIANCE_* variables)")
    commands.add_parser("migrate", help="upgrade the database to the latest schema")
    commands.add_parser("settings", help="print the settings table (Markdown)")
    commands.add_parser("set-admin-password", help="set the admin password (from stdin or a prompt)")
    args = parser.parse_args(argv)
    if args.command == "settings":
        _print_settings()
        return
    try:
        settings = load_settings()
        if args.command == "serve":
            from appliance.serve import serve

            serve(settings)
        elif args.command == "migrate":
            _migrate(settings)
        else:
            _set_admin_password(settings)
    except (SettingsError, ConfigError, AppError) as exc:
        raise SystemExit(f"appliance: {exc}") from None


if __name__ == "__main__":
    main()
