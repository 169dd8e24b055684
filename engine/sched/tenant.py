"""Who a request is for: the tenant (an API key, a user) whose share of the engine it draws on.

A msgspec struct, so it crosses the process boundary inside the add-request message as is.
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

from engine.errors import InvalidRequestError

Priority = Literal["interactive", "batch"]
MAX_TENANT_ID_CHARS = 256


class Tenant(msgspec.Struct, frozen=True):
    """weight: the tenant's share relative to others (2.0 gets twice the service of 1.0 when both are busy).
    priority: interactive requests are always admitted before batch ones; fairness holds within each class."""

    id: str
    weight: float = 1.0
    priority: Priority = "interactive"

    def __post_init__(self) -> None:
        if not self.id or len(self.id) > MAX_TENANT_ID_CHARS:
            raise InvalidRequestError(f"a tenant id must have 1 to {MAX_TENANT_ID_CHARS} characters", "tenant")
        if isinstance(self.weight, bool) or not (math.isfinite(self.weight) and self.weight > 0):
            raise InvalidRequestError(f"a tenant's weight must be a finite number > 0, not {self.weight!r}", "tenant")
        if self.priority not in ("interactive", "batch"):
            raise InvalidRequestError(
                f"a tenant's priority must be interactive or batch, not {self.priority!r}", "tenant"
            )


# Requests that name no tenant share this one: with only it, the fair policy orders like fcfs.
DEFAULT_TENANT = Tenant("default")
