"""The `appliance` command: serve, migrate, keys, admin, status, chat, doctor, models, audit, bench, assets,
settings, layout.

Settings come from APPLIANCE_* variables and the env file named by APPLIANCE_ENV_FILE; `serve` and `doctor`
take any setting as a flag too (--port 9000 is APPLIANCE_PORT=9000), except the secrets.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import getpass
import os
import sys
from collections.abc import Sequence

from appliance.cli import audit, chat, keys, layout
from appliance.cli import models as models_cli
from appliance.settings import PREFIX, Settings, SettingsError, load_settings, settings_table
from engine import ConfigError
from web.errors import AppError

COMMANDS = "{serve,migrate,keys,admin,status,chat,doctor,models,audit,bench,assets,settings,layout}"


def add_setting_flags(parser: argparse.ArgumentParser, names: Sequence[str] | None = None) -> None:
    """One --flag per setting (or per named one); secrets stay out of the command line, where ps shows them."""
    docs = {row.variable: row for row in settings_table()}
    for field in dataclasses.fields(Settings):
        if field.metadata["secret"] or (names is not None and field.name not in names):
            continue
        variable = PREFIX + field.name.upper()
        parser.add_argument(
            "--" + field.name.replace("_", "-"),
            dest="setting_" + field.name,
            metavar=docs[variable].type.split()[0].upper(),
            help=f"{docs[variable].description} ({variable})",
        )


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings with the command line's flags over the environment and the env file. The chat's key variable
    is a client's, not a server setting: a shell that exports it still runs every command."""
    overrides = {
        PREFIX + name.removeprefix("setting_").upper(): value
        for name, value in vars(args).items()
        if name.startswith("setting_") and value is not None
    }
    environ = {k: v for k, v in os.environ.items() if k != chat.KEY_VARIABLE}
    return load_settings({**environ, **overrides})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="appliance", description="The edge LLM serving appliance.")
    commands = parser.add_subparsers(dest="command", required=True, metavar=COMMANDS)

    serve = commands.add_parser("serve", help="serve the API, the chat page and the console")
    add_setting_flags(serve)
    commands.add_parser("migrate", help="upgrade the database to the latest schema")
    keys.add_parsers(commands)

    admin = commands.add_parser("admin", help="the admin credential of the console and the admin API")
    admin_actions = admin.add_subparsers(dest="admin_command", required=True, metavar="{set-password}")
    set_password = admin_actions.add_parser("set-password", help="set the admin password (prompted twice)")
    set_password.add_argument("--password-stdin", action="store_true", help="read it from stdin's first line")
    # The old name, kept for scripts: reads stdin when it is not a terminal.
    commands.add_parser("set-admin-password")

    status = commands.add_parser("status", help="ask the running server how it is doing (exit 0 ready, 1 not, 3 down)")
    add_setting_flags(status, ("host", "port"))
    status.add_argument(
        "--password-stdin",
        action="store_true",
        help="the admin password from stdin's first line (default: APPLIANCE_ADMIN_PASSWORD)",
    )
    status.add_argument("--json", action="store_true", help="print the server's stats as JSON")

    chatting = commands.add_parser("chat", help="chat with the running server in this terminal (Ctrl-C stops a reply)")
    add_setting_flags(chatting, ("host", "port"))
    chatting.add_argument("--url", help="the appliance's address (default: this machine's, from --host and --port)")
    chatting.add_argument("--key", help="the API key (default: APPLIANCE_API_KEY, else asked; ps shows a flag's value)")
    chatting.add_argument("--max-tokens", type=int, help="the longest reply, in tokens (default: the server's)")
    chatting.add_argument("--temperature", type=float, help="sampling temperature (default: the server's)")

    doctor = commands.add_parser("doctor", help="check this machine for the appliance, one line per check")
    add_setting_flags(doctor)
    models_cli.add_parsers(commands, add_setting_flags)
    audit.add_parsers(commands)
    commands.add_parser("bench", help="the engine benchmark (options: appliance bench --help)", add_help=False)
    assets = commands.add_parser(
        "assets", help="front-end assets (htmx, markdown-it, DOMPurify, highlight.js) from the npm registry, pinned"
    )
    assets.add_subparsers(dest="assets_command", required=True, metavar="{fetch}").add_parser(
        "fetch", help="fetch them into the installed package (skipped when the pinned files are there)"
    )
    commands.add_parser("settings", help="print every setting as a Markdown table (the README's)")
    commands.add_parser("layout", help="print the source tree's folders and the engine's modules (the README's tables)")
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        # Every option belongs to the benchmark; argparse would try to read them itself.
        raise SystemExit(_bench(argv[1:]))
    args = build_parser().parse_args(argv)
    if args.command == "settings":
        _print_settings()
        return
    if args.command == "layout":
        raise SystemExit(layout.main())
    if args.command == "assets":
        from web.static.assets import main as fetch_assets

        fetch_assets()
        return
    try:
        code = _run(args)
    except (SettingsError, ConfigError, AppError, LookupError) as exc:
        raise SystemExit(f"appliance: {exc}") from None
    if code:
        raise SystemExit(code)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from(args)
    if args.command == "serve":
        from appliance.serve import serve

        serve(settings)
    elif args.command == "migrate":
        from appliance.database import migrate

        migrate(settings)
    elif args.command == "keys":
        keys.run(settings, args)
    elif args.command in ("admin", "set-admin-password"):
        from appliance.database import set_admin_password

        from_stdin = args.password_stdin if args.command == "admin" else not sys.stdin.isatty()
        set_admin_password(settings, _new_password(from_stdin))
        print("admin password updated; the console and the admin API take it at once")
    elif args.command == "status":
        from appliance.cli.status import StatusError, status

        password = _stdin_line("the admin password") if args.password_stdin else settings.admin_password
        try:
            return status(settings, password, args.json)
        except StatusError as exc:
            print(f"appliance: {exc}", file=sys.stderr)
            return exc.exit_code
    elif args.command == "chat":
        return chat.run(args.url or settings.local_url, args.key, args.max_tokens, args.temperature)
    elif args.command == "doctor":
        from appliance.doctor.report import run

        return run(settings)
    elif args.command == "models":
        return models_cli.run(settings, args)
    elif args.command == "audit":
        return audit.run(settings, args)
    return 0


def _stdin_line(what: str) -> str:
    line = sys.stdin.readline().rstrip("\r\n")
    if not line:
        raise SystemExit(f"appliance: expected {what} on stdin's first line")
    return line


def _new_password(from_stdin: bool) -> str:
    if from_stdin:
        return _stdin_line("the new admin password")
    if not sys.stdin.isatty():
        raise SystemExit("appliance: no terminal to prompt on: pipe the password in with --password-stdin")
    password = getpass.getpass("new admin password: ")
    if getpass.getpass("again: ") != password:
        raise SystemExit("appliance: the two passwords differ; nothing changed")
    return password


def _bench(argv: list[str]) -> int:
    """bench.engine with its own options; the model cache is the appliance's when its settings load."""
    # The benchmark needs no settings: without them the engine picks its own cache directory.
    with contextlib.suppress(SettingsError):
        if not any(arg.startswith("--cache-dir") for arg in argv):
            argv = [*argv, "--cache-dir", str(load_settings().model_cache_dir)]
    from bench.engine.__main__ import main as bench_main

    return bench_main(argv)


def _print_settings() -> None:
    print("| Variable | Type | Default | Description |")
    print("|---|---|---|---|")
    for row in settings_table():
        print(f"| `{row.variable}` | {row.type} | `{row.default}` | {row.description} |")


if __name__ == "__main__":
    main()
