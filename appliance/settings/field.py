"""What every room's settings are made of: the APPLIANCE_ prefix, the error that names a variable, and `setting`,
a dataclass field that carries its one-line description for the README table."""

from __future__ import annotations

from dataclasses import field
from typing import Any

PREFIX = "APPLIANCE_"


class SettingsError(ValueError):
    """A setting has a value that cannot be used; the message names the environment variable."""


def setting(default: Any, doc: str, *, secret: bool = False, default_doc: str | None = None) -> Any:
    """A field with its one-line description; secrets are kept out of repr (and so out of logs)."""
    metadata = {"doc": doc, "secret": secret, "default_doc": default_doc}
    if callable(default):
        return field(default_factory=default, metadata=metadata, repr=not secret)
    return field(default=default, metadata=metadata, repr=not secret)


def at_least_one(s: object, *names: str) -> None:
    """Counts, sizes and limits where zero (or less) would serve nothing."""
    for name in names:
        if getattr(s, name) < 1:
            raise SettingsError(f"{PREFIX}{name.upper()} must be at least 1, not {getattr(s, name)}")
