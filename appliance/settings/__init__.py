"""The appliance's settings: read once from APPLIANCE_* environment variables and an optional env file, one
module per room (server, engine, API, backends, sign-in), each field with its default and a one-line description.

`Settings` is their sum; `settings_table()` lists them for the README.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from appliance.settings.api import ApiSettings, check_api
from appliance.settings.backends import BackendSettings, check_backends
from appliance.settings.engine import EngineSettings, check_engine_choice, check_engine_sizes
from appliance.settings.field import PREFIX, SettingsError
from appliance.settings.server import ServerSettings, check_server
from appliance.settings.sign_in import SignInSettings, check_sign_in

__all__ = ["PREFIX", "Settings", "SettingsError", "load_settings", "settings_table"]

ENV_FILE_VARIABLE = "APPLIANCE_ENV_FILE"


# Dataclasses take fields from the last base to the first: the table reads server, engine, API, backends, sign-in.
@dataclass(frozen=True)
class Settings(SignInSettings, BackendSettings, ApiSettings, EngineSettings, ServerSettings):
    """Every setting of the appliance, each room's from its own module."""


@dataclass(frozen=True, slots=True)
class SettingDoc:
    variable: str
    type: str
    default: str
    description: str


def settings_table() -> list[SettingDoc]:
    """One row per setting: environment variable, type, default and description (for the README)."""
    hints = get_type_hints(Settings)
    rows = []
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        if meta["default_doc"] is not None:
            default = meta["default_doc"]
        else:
            value = f.default
            default = "(unset)" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        rows.append(SettingDoc(PREFIX + f.name.upper(), _type_name(hints[f.name]), default, meta["doc"]))
    return rows


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Build Settings from the env file named by APPLIANCE_ENV_FILE (if any), overridden by the environment."""
    env = dict(os.environ if environ is None else environ)
    values: dict[str, str] = {}
    env_file = env.get(ENV_FILE_VARIABLE)
    if env_file:
        values.update(read_env_file(Path(env_file)))
    values.update({k: v for k, v in env.items() if k.startswith(PREFIX)})
    hints = get_type_hints(Settings)
    kwargs: dict[str, Any] = {}
    known = {PREFIX + f.name.upper() for f in dataclasses.fields(Settings)} | {ENV_FILE_VARIABLE}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SettingsError(f"unknown setting(s): {', '.join(unknown)}")
    for f in dataclasses.fields(Settings):
        variable = PREFIX + f.name.upper()
        if variable in values:
            kwargs[f.name] = _parse(variable, values[variable], hints[f.name])
    settings = Settings(**kwargs)
    check_server(settings)
    check_engine_sizes(settings)
    check_api(settings)
    check_backends(settings)
    check_sign_in(settings)
    check_engine_choice(settings)  # last: vLLM's checks look for its venv on disk
    return settings


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile reads them: # comments, optional quotes, blank lines."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{ENV_FILE_VARIABLE}: cannot read {path}: {exc.strerror}") from None
    values = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.removeprefix("export ").partition("=")
        if not sep:
            raise SettingsError(f"{path}:{number}: expected KEY=VALUE")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _parse(variable: str, raw: str, hint: Any) -> Any:
    optional = get_origin(hint) in (Union, types.UnionType) and type(None) in get_args(hint)
    base = next(a for a in get_args(hint) if a is not type(None)) if optional else hint
    text = raw.strip()
    if optional and text == "":
        return None
    try:
        if base is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if base is int:
            return int(text.replace("_", ""))
        if base is float:
            return float(text)
    except ValueError:
        raise SettingsError(f"{variable} must be a {_type_name(base)}, not {raw!r}") from None
    return text


def _type_name(hint: Any) -> str:
    args = [a for a in get_args(hint) if a is not type(None)]
    base = args[0] if args else hint
    name = {str: "string", int: "integer", float: "number", bool: "boolean"}.get(base, str(base))
    return f"{name} (optional)" if args else name
