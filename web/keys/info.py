"""What a request knows about its key: the key's snapshot (KeyInfo), its admin-settable limits (KeyLimits) and
its trust as a front end, and whose slots and quota a request takes (its holder)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any, Literal, cast, get_args

from sqlalchemy import Row

from engine import Tenant
from web.db import SQLITE_INT_MAX
from web.errors import InvalidRequest
from web.keys.periods import PERIODS
from web.models import ApiKey

# The engine's priority classes (engine.Tenant.priority): interactive requests are admitted before batch ones.
Priority = Literal["interactive", "batch"]
PRIORITIES: tuple[str, ...] = get_args(Priority)
# A weight is a share against other busy keys; beyond a million to one the counters say nothing more.
MIN_WEIGHT, MAX_WEIGHT = 1e-3, 1e6


@dataclass(frozen=True, slots=True)
class FrontEnd:
    """A key's trust as a front end: whether its requests may name their end users (each then their own tenant
    and quota), whether a name that is a person's account runs as that person, and the end users' plan."""

    enabled: bool = False
    accounts: bool = False
    plan_id: int | None = None


NOT_FRONT_END = FrontEnd()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """What a request needs to know about its key; a plain snapshot, detached from any session. A person signed
    in on the chat page comes with no key (id None) and their user_id."""

    id: int | None
    name: str
    prefix: str
    max_tokens_per_request: int | None
    quota_tokens: int | None
    quota_period: str
    max_concurrent: int | None
    created_at: datetime
    revoked_at: datetime | None
    weight: float
    priority: str
    # A personal key: its owner's id; the limits above are the owner's plan's (web/people/plans.py), the quota
    # counted is the owner's, from `quota_since` (when the person was made).
    user_id: int | None = None
    models: tuple[str, ...] = ()  # the served names it may use; empty: all
    quota_since: datetime | None = None
    front_end: FrontEnd = NOT_FRONT_END
    # A front end's end user (web/keys/front_end.py): the limits above are theirs, the quota counted theirs.
    end_user_id: int | None = None
    end_user: str | None = None

    @classmethod
    def of(cls, row: ApiKey | Row[Any]) -> KeyInfo:
        return cls(
            row.id,
            row.name,
            row.prefix,
            row.max_tokens_per_request,
            row.quota_tokens,
            row.quota_period,
            row.max_concurrent,
            row.created_at,
            row.revoked_at,
            row.weight,
            row.priority,
            row.user_id,
            front_end=FrontEnd(row.front_end, row.front_end_accounts, row.front_end_plan_id),
        )

    @property
    def tenant(self) -> Tenant:
        """Who the engine's fair scheduler and the gateway's fair queue count this key's requests against: its
        owner, whichever of their keys or sessions a request comes by; a key of no one is its own tenant."""
        if self.user_id is not None:
            tenant_id = f"user:{self.user_id}"
        elif self.end_user is not None:  # one of a front end's people: a tenant of their own
            tenant_id = f"fe:{self.id}:{self.end_user}"
        else:
            tenant_id = str(self.id)
        return Tenant(tenant_id, self.weight, cast(Priority, self.priority))

    @property
    def holder(self) -> int | str:
        """Whose concurrency slots and quota a request takes: the owner's, or the key's own."""
        return holder_of(self.id, self.user_id, self.end_user_id)

    @property
    def limits(self) -> KeyLimits:
        return KeyLimits(
            self.max_tokens_per_request,
            self.quota_tokens,
            self.quota_period,
            self.max_concurrent,
            self.weight,
            self.priority,
        )

    def running_under(self, limits: KeyLimits, models: tuple[str, ...], quota_since: datetime, **who: Any) -> KeyInfo:
        """This key as a request runs it under someone else's limits (a personal key's owner's plan, a front end's
        end user's): the one place a plan's limits are copied onto a key; `who` names whose they are."""
        return replace(self, **asdict(limits), models=models, quota_since=quota_since, **who)

    @property
    def stored_id(self) -> int:
        """The id of a key that exists: every KeyInfo but a signed-in person's (who comes with no key)."""
        assert self.id is not None, "a request without a key is a signed-in person's"
        return self.id

    @classmethod
    def signed_in(cls, user_id: int, username: str, created_at: datetime) -> KeyInfo:
        """A person on the chat page, who comes by their session and with no key: their plan's limits are set
        on it as on their personal keys (web/people/plans.py)."""
        return cls(None, username, "", None, None, "none", None, created_at, None, 1.0, "interactive", user_id)

    @property
    def period_anchor(self) -> datetime:
        """Where a quota of period "none" counts from."""
        return self.quota_since or self.created_at


def person_holder(user_id: int) -> str:
    return f"user:{user_id}"


def holder_of(key_id: int | None, user_id: int | None, end_user_id: int | None) -> int | str:
    """Whose concurrency slots a request takes: its person's, else its end user's, else its key's."""
    if user_id is not None:
        return person_holder(user_id)
    if end_user_id is not None:
        return f"fe:{end_user_id}"
    assert key_id is not None, "a request without a key is a signed-in person's"
    return key_id


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """The admin-settable limits of a key; None means no limit."""

    max_tokens_per_request: int | None = None
    quota_tokens: int | None = None
    quota_period: str = "none"
    max_concurrent: int | None = None
    weight: float = 1.0
    priority: str = "interactive"

    def check(self) -> None:
        if self.quota_period not in PERIODS:
            raise InvalidRequest(f"quota_period must be one of {', '.join(PERIODS)}", param="quota_period")
        if self.priority not in PRIORITIES:
            raise InvalidRequest(f"priority must be one of {', '.join(PRIORITIES)}", param="priority")
        if isinstance(self.weight, bool) or not (
            math.isfinite(self.weight) and MIN_WEIGHT <= self.weight <= MAX_WEIGHT
        ):
            raise InvalidRequest(f"weight must be a number from {MIN_WEIGHT:g} to {MAX_WEIGHT:g}", param="weight")
        for name in ("max_tokens_per_request", "quota_tokens", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= SQLITE_INT_MAX:
                raise InvalidRequest(
                    f"{name} must be between 1 and {SQLITE_INT_MAX} (or null for no limit)", param=name
                )
