"""Admin API bodies for keys: create/update requests and the key view with its usage."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType

from web.db import SQLITE_INT_MAX
from web.keys.info import MAX_WEIGHT, MIN_WEIGHT, Priority
from web.keys.periods import Period

# A key's limits, declared once: msgspec enforces them on the admin API's bodies and the OpenAPI document is
# generated from them; KeyLimits.check applies the same bounds to the console's forms and the CLI.
Limit = Annotated[int, Meta(ge=1, le=SQLITE_INT_MAX, description="null for no limit")]
Weight = Annotated[
    float, Meta(ge=MIN_WEIGHT, le=MAX_WEIGHT, description="share against other busy keys (2 gets twice 1's)")
]
KeyName = Annotated[str, Meta(min_length=1, pattern=r"\S")]  # one of only spaces is blank
PlanId = Annotated[int, Meta(ge=1, le=SQLITE_INT_MAX, description="the end users' plan (null: the key's limits)")]


class KeyCreate(Struct, kw_only=True, forbid_unknown_fields=True):
    name: KeyName
    max_tokens_per_request: Limit | None = None
    quota_tokens: Limit | None = None
    quota_period: Period = "none"
    max_concurrent: Limit | None = None
    weight: Weight = 1.0
    priority: Priority = "interactive"
    # A trusted front end (Open WebUI): its requests may name their end users, each their own tenant and quota.
    front_end: bool = False
    front_end_accounts: bool = False  # a name that is an account's user name runs as that person (never an admin)
    front_end_plan_id: PlanId | None = None


class KeyUpdate(Struct, kw_only=True, forbid_unknown_fields=True):
    """Fields left out keep their value; null clears a limit."""

    name: KeyName | UnsetType = UNSET
    max_tokens_per_request: Limit | UnsetType | None = UNSET
    quota_tokens: Limit | UnsetType | None = UNSET
    quota_period: Period | UnsetType = UNSET
    max_concurrent: Limit | UnsetType | None = UNSET
    weight: Weight | UnsetType = UNSET
    priority: Priority | UnsetType = UNSET
    front_end: bool | UnsetType = UNSET
    front_end_accounts: bool | UnsetType = UNSET
    front_end_plan_id: PlanId | UnsetType | None = UNSET


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
    weight: float
    priority: str
    usage: UsageView
    front_end: bool = False
    front_end_accounts: bool = False
    front_end_plan_id: int | None = None


class EndUserView(Struct):
    """One person behind a front-end key, as its requests named them, with their usage."""

    id: int
    name: str
    plan_id: int | None  # their own plan; null: the front end's end-user plan
    used_tokens: int
    reserved_tokens: int
    total_tokens: int
    total_requests: int
    first_seen_at: datetime
    last_used_at: datetime | None


class CreatedKey(Struct):
    """The only response that ever carries the key itself."""

    key: str
    info: KeyView
