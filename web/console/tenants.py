"""Who is using the engine, per key: running and waiting requests, each key's share of the tokens over the last
minute against the share its weight entitles it to, and the key that holds most of the seats while others wait."""

from __future__ import annotations

from dataclasses import dataclass

from engine import EngineStats, TenantStats

# A key "holds most seats" when it runs at least this share of the running requests while a request waits.
MOST_SEATS = 0.5


@dataclass(frozen=True, slots=True)
class KeyShare:
    name: str  # the key's name, or its tenant id when no key has it (the engine's default tenant)
    priority: str
    weight: float
    running: int
    waiting: int
    tokens_per_s: float
    token_share: float | None  # of all the busy keys' tokens over the last minute; None while none were made
    weight_share: float  # what its weight entitles it to, among the busy keys of its class


@dataclass(frozen=True, slots=True)
class SeatHolder:
    name: str
    running: int
    seats_in_use: int
    weight_share: float
    others_waiting: int


def key_shares(stats: EngineStats | None, names: dict[str, str]) -> list[KeyShare]:
    """One row per busy (or lately busy) key, most seats first."""
    if stats is None:
        return []
    tenants = stats.tenants
    total_rate = sum(t.tokens_per_s for t in tenants)
    class_weight: dict[str, float] = {}
    for t in tenants:
        class_weight[t.priority] = class_weight.get(t.priority, 0.0) + t.weight
    rows = [
        KeyShare(
            name=_name(t, names),
            priority=t.priority,
            weight=t.weight,
            running=t.running,
            waiting=t.waiting,
            tokens_per_s=t.tokens_per_s,
            token_share=t.tokens_per_s / total_rate if total_rate > 0 else None,
            weight_share=t.weight / class_weight[t.priority] if class_weight[t.priority] > 0 else 0.0,
        )
        for t in tenants
    ]
    return sorted(rows, key=lambda r: (-r.running, -r.waiting, r.name))


def seat_holder(shares: list[KeyShare]) -> SeatHolder | None:
    """The key running the largest share of the seats, when that is most of them and another key's request
    waits: the one an operator should look at first."""
    seats = sum(s.running for s in shares)
    if not shares or seats == 0:
        return None
    top = max(shares, key=lambda s: s.running)
    others_waiting = sum(s.waiting for s in shares if s is not top)
    if top.running < MOST_SEATS * seats or others_waiting == 0 or len(shares) < 2:
        return None
    return SeatHolder(top.name, top.running, seats, top.weight_share, others_waiting)


def holder_detail(holder: SeatHolder) -> str:
    return (
        f"Key '{holder.name}' holds {holder.running} of the {holder.seats_in_use} seats in use "
        f"(its weight entitles it to {holder.weight_share:.0%} of its class) while {holder.others_waiting} "
        "request(s) of other keys wait."
    )


def holder_levers(holder: SeatHolder) -> list[str]:
    return [
        f"lower the weight of key '{holder.name}', or move it to the batch class, so the others go first "
        f"(the console's key form, or: appliance keys set '{holder.name}' --weight 0.5 --class batch)",
        f"a concurrency cap on key '{holder.name}' bounds the seats it can take at once "
        f"(appliance keys set '{holder.name}' --concurrency N)",
    ]


def _name(t: TenantStats, names: dict[str, str]) -> str:
    """A key's name, a person's user name (their tenant id is user:<id>), or the id itself (the engine's default
    tenant: requests that came without a key); a front end's end user (fe:<key id>:<name>) as "key / name"."""
    if t.id.startswith("fe:") and t.id not in names:
        key_id, _, end_user = t.id[3:].partition(":")
        return f"{names.get(key_id, key_id)} / {end_user}"
    return names.get(t.id, t.id)
