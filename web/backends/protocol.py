"""The one protocol every backend speaks to the router, and what a backend serves a model as."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine import ModelInfo, RequestOutput, SamplingParams, Tenant
from web.backends.scrape import Load
from web.backends.status import BackendState


@dataclass(frozen=True, slots=True)
class Served:
    """A model as one backend serves it: the name clients ask for, the id the backend knows it by, and what the
    gateway needs to prepare a request for it (its tokenizer and context)."""

    name: str
    upstream_id: str
    info: ModelInfo  # a remote model's pool is unknown: its "pool" is its context (check_fits checks that)
    tokenizer: Any


class Backend(Protocol):
    name: str  # as history rows name it
    kind: str  # "embedded" or "remote"
    url: str | None  # without credentials

    def models(self) -> dict[str, Served]:
        """The served names it answers for now (none while it is not up)."""
        ...

    def state(self) -> BackendState: ...

    def load(self) -> Load | None:
        """Its latest waiting/running/KV figures (None: it exports none)."""
        ...

    def generate(
        self,
        served: Served,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        request_id: str,
        arrival_time: float | None,
        tenant: Tenant | None,
    ) -> AsyncIterator[RequestOutput]:
        """Queue the request at once; refusals and failures come with the first item; closing the stream early
        aborts it."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def probe(self) -> None:
        """Refresh state, load and models (a remote asks the server; the embedded engine has them at hand)."""
        ...
