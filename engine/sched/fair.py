"""Fair share between tenants: the Virtual Token Counter of Sheng et al., "Fairness in Serving Large Language
Models" (OSDI 2024), as the scheduler's ledger and victim choice. Pure Python, no torch.

Each tenant has a counter of the service it received: prompt tokens computed at W_IN, generated tokens at
W_OUT, divided by its weight. The waiting tenant with the smallest counter is admitted next (engine.sched.queues);
a tenant that comes back from idle has its counter lifted to the smallest active one, so idleness banks no
credit. Interactive tenants form a band above batch ones: fairness holds within a band.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from engine.messages import TenantStats
from engine.sched.request import Request
from engine.sched.tenant import Tenant

# VTC's own weights: a generated token costs twice a prompt token. A decode step is memory-bound and occupies
# a seat for a whole step per token, while prefill tokens are computed many to a step.
W_IN = 1.0
W_OUT = 2.0
# A request is taken back from its seat for a fairer tenant at most this often, so long requests finish.
MAX_RECLAIMS = 2
RATE_WINDOW = 60.0  # seconds: the time constant of each tenant's token rate ("the last minute")
ADMISSION_WINDOW = 10.0  # seconds: the time constant of the admission rate that ETAs are computed from
BANDS = {"interactive": 0, "batch": 1}
_EPS = 1e-9


class Tenanted(Protocol):
    """What the ledger needs of a request: whose it is (the engine's Request, or a gateway's queued request)."""

    @property
    def tenant(self) -> Tenant: ...


@dataclass(slots=True, eq=False)
class TenantState:
    tenant: Tenant
    band: int
    counter: float = 0.0
    running: int = 0
    waiting: int = 0
    tokens_total: int = 0  # prompt tokens computed plus tokens generated, recomputation excluded
    tokens_rate: float = 0.0
    tokens_marked: int = 0  # tokens_total when tokens_rate was last brought up to date

    @property
    def active(self) -> bool:
        return self.running + self.waiting > 0


class TenantBook:
    """The per-tenant ledger. The scheduler reports every arrival, admission, token, preemption and exit (and so
    does the gateway's queue in front of remote backends, web/backends/seats.py, with the same policy)."""

    def __init__(self) -> None:
        self.tenants: dict[str, TenantState] = {}
        self.admissions_total = 0
        self.admission_rate = 0.0
        self._admissions_marked = 0
        self._rated_at: float | None = None
        self._last_left = 0.0  # counter of the last tenant to go idle: the floor when no tenant is active
        self._active_weight = [0.0, 0.0]  # per band, the summed weight of active tenants

    def of(self, req: Tenanted) -> TenantState:
        return self.tenants[req.tenant.id]

    # -- events --------------------------------------------------------------------------------------------

    def arrive(self, req: Tenanted) -> None:
        tenant = req.tenant
        st = self.tenants.get(tenant.id)
        if st is None:
            st = self.tenants[tenant.id] = TenantState(tenant, BANDS[tenant.priority])
        if not st.active:
            st.counter = max(st.counter, self.floor())
            self._set_tenant(st, tenant)
            self._active_weight[st.band] += tenant.weight
        elif st.tenant != tenant:  # a key's weight or class changed: its latest request's values count
            self._active_weight[st.band] -= st.tenant.weight
            self._set_tenant(st, tenant)
            self._active_weight[st.band] += tenant.weight
        st.waiting += 1

    def admitted(self, req: Tenanted, prompt_tokens: int) -> None:
        """prompt_tokens: the prompt tokens this admission will compute that were never charged before."""
        st = self.tenants[req.tenant.id]
        st.waiting -= 1
        st.running += 1
        st.counter += W_IN * prompt_tokens / st.tenant.weight
        st.tokens_total += prompt_tokens
        self.admissions_total += 1

    def generated(self, req: Tenanted, tokens: int = 1) -> None:
        st = self.tenants[req.tenant.id]
        st.counter += tokens * W_OUT / st.tenant.weight
        st.tokens_total += tokens

    def generated_each(self, reqs: Iterable[Tenanted]) -> None:
        """One token for each of reqs (a step's; once per running request per step, so without a call each)."""
        tenants = self.tenants
        for req in reqs:
            st = tenants[req.tenant.id]
            st.counter += W_OUT / st.tenant.weight
            st.tokens_total += 1

    def preempted(self, req: Tenanted) -> None:
        st = self.tenants[req.tenant.id]
        st.running -= 1
        st.waiting += 1

    def left(self, req: Tenanted, was_running: bool) -> None:
        st = self.tenants[req.tenant.id]
        if was_running:
            st.running -= 1
        else:
            st.waiting -= 1
        if not st.active:
            self._last_left = st.counter
            self._active_weight[st.band] = max(0.0, self._active_weight[st.band] - st.tenant.weight)

    def floor(self) -> float:
        """The smallest counter among active tenants (the last one to leave when none is active)."""
        active = [st.counter for st in self.tenants.values() if st.active]
        return min(active) if active else self._last_left

    def _set_tenant(self, st: TenantState, tenant: Tenant) -> None:
        st.tenant, st.band = tenant, BANDS[tenant.priority]

    # -- choices -------------------------------------------------------------------------------------------

    def kv_victim(self, running: list[Request]) -> int:
        """Index in running of the request to preempt when KV blocks run out: the newest request of the
        tenant that received the most (batch before interactive). With one tenant, simply the newest."""
        best, best_key = len(running) - 1, (-1, -math.inf)
        for i in range(len(running) - 1, -1, -1):
            st = self.tenants[running[i].tenant.id]
            key = (st.band, st.counter)
            if key > best_key:
                best, best_key = i, key
        return best

    def reclaim_victim(self, head: Request, running: list[Request], max_seats: int) -> int | None:
        """Index in running of a request to preempt so that head, which found no seat or blocks, can start; or
        None. Only a tenant below its seat share (seats split by weight among the band's active tenants) may
        take a seat back, and only from a batch tenant or from one that stays at or above its own share after
        losing the seat and has received at least as much as head's tenant (one back from idle is lifted to
        exactly the floor, so a tie counts). The victim is the newest request of the tenant that received the
        most, never one already preempted MAX_RECLAIMS times."""
        hs = self.tenants[head.tenant.id]
        band_weight = self._active_weight[hs.band]
        if band_weight <= 0 or hs.running + 1 > max_seats * hs.tenant.weight / band_weight + _EPS:
            return None
        best, best_key = None, (-1, -math.inf)
        for i in range(len(running) - 1, -1, -1):
            req = running[i]
            st = self.tenants[req.tenant.id]
            if st is hs or req.num_preemptions >= MAX_RECLAIMS or st.band < hs.band:
                continue
            if st.band == hs.band and (
                st.counter < hs.counter or st.running - 1 < max_seats * st.tenant.weight / band_weight - _EPS
            ):
                continue
            key = (st.band, st.counter)
            if key > best_key:
                best, best_key = i, key
        return best

    # -- reporting -----------------------------------------------------------------------------------------

    def snapshot(self, now: float) -> list[TenantStats]:
        """Per-tenant numbers for the stats snapshot; brings the decaying rates up to date. Idle tenants whose
        rate has faded and whose counter the floor has reached are forgotten: on return they would be lifted
        to the floor anyway, so nothing is lost and the ledger stays as small as the set of busy tenants."""
        dt = 0.0 if self._rated_at is None else now - self._rated_at
        self._rated_at = now
        self.admission_rate = _decayed(
            self.admission_rate, self.admissions_total - self._admissions_marked, dt, ADMISSION_WINDOW
        )
        self._admissions_marked = self.admissions_total
        floor = self.floor()
        out = []
        for tid, st in list(self.tenants.items()):
            st.tokens_rate = _decayed(st.tokens_rate, st.tokens_total - st.tokens_marked, dt, RATE_WINDOW)
            st.tokens_marked = st.tokens_total
            if not st.active and st.tokens_rate < 0.01:
                if st.counter <= floor:
                    del self.tenants[tid]
                continue
            t = st.tenant
            out.append(TenantStats(tid, t.weight, t.priority, st.running, st.waiting, st.tokens_rate, st.counter))
        return out


def _decayed(rate: float, events: int, dt: float, window: float) -> float:
    """An exponentially weighted rate (per second) after `events` more in the last dt seconds."""
    if dt <= 0:
        return rate
    keep = math.exp(-dt / window)
    return rate * keep + events / dt * (1 - keep)
