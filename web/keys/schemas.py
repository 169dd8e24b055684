"""Admin API bodies for keys: create/update requests and the key view with its usage."""

from __future__ import annotations

from datetime import datetime

from msgspec import UNSET, Struct, UnsetType


class KeyCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: str
    max_tokens_per_request: int | None = None
    quota_tokens: int | None = None
    quota_period: str = "none"
    max_concurrent: int | None = None


class KeyUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out keep their value; null clears a limit."""

    name: str | UnsetType = UNSET
    max_tokens_per_request: int | UnsetType | None = UNSET
    quota_tokens: int | UnsetType | None = UNSET
    quota_period: str | UnsetType = UNSET
    max_concurrent: int | UnsetType | None = UNSET


class UsageView(Struct):
    period_start: datetime | None
    period_end: datetime | None
    used_tokens: int
    reserved_tokens: int
    remaining_tokens: int | None
    total_tokens: int
    total_requests: int
    last_used_at: datetime | None
    in_flight: int


class KeyView(Struct):
    id: int
    name: str
    prefix: str
    created_at: datetime
    revoked_at: datetime | None
    max_tokens_per_request: int | None
    quota_tokens: int | None
    quota_period: str
    max_concurrent: int | None
    usage: UsageView


class CreatedKey(Struct):
    """The only response that ever carries the key itself."""

    key: str
    info: KeyView
