"""Trusted front ends: Open WebUI (or any chat front end) in front of the gateway speaks for many people with one
key. On a key the admin marked as a front end, a request may name the person it is for (its end user), who then
runs as a tenant of their own: their own fair-share seat (`fe:<key>:<name>`), their own quota under the front
end's end-user plan, their own history rows. With front_end_accounts on, the request's names are tried in order
(the id header, the email header, the body's user) and the first that is an account's user name (role user: never
an admin) runs as that person, as if they had signed in; Open WebUI always sends its own uuid as the id, so its
email header is what matches. Where none is an account, the first name is the end user.

An ordinary key's names are ignored: it stays one tenant, and no header can spend anyone else's quota."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.db import SQLITE_INT_MAX
from web.errors import AuthenticationFailed, InvalidRequest, NotFound
from web.keys.info import KeyInfo
from web.keys.schemas import EndUserView
from web.models import ApiKey, EndUser, Plan, User, utcnow
from web.people.plans import PlanInfo, Plans

# What Open WebUI sends with ENABLE_FORWARD_USER_INFO_HEADERS=true, the stable id first (X-OpenWebUI-User-Name is
# a display name, which people share and change: never a tenant).
NAME_HEADERS = ("x-openwebui-user-id", "x-openwebui-user-email")
MAX_NAME = 256  # requests.user's and end_users.name's width


def check_name(name: str) -> str:
    if not 1 <= len(name) <= MAX_NAME or not name.isprintable() or not name.strip():
        raise InvalidRequest(
            f"an end user's name has 1 to {MAX_NAME} printable characters (X-OpenWebUI-User-Id, "
            "X-OpenWebUI-User-Email, or the body's user)",
            param="user",
        )
    return name


def given_names(headers: Mapping[str, str], body_user: str | None) -> list[str]:
    """The names a request gives, in order: X-OpenWebUI-User-Id, X-OpenWebUI-User-Email, the body's user (OpenAI's
    `user`, Anthropic's `metadata.user_id`); each checked. The first is its end user; empty where it names none."""
    return [check_name(v) for v in (*(headers.get(h) for h in NAME_HEADERS), body_user) if v is not None]


class FrontEnds:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], plans: Plans) -> None:
        self.sessions = sessions
        self.plans = plans

    async def resolve(self, key: KeyInfo, headers: Mapping[str, str], body_user: str | None) -> KeyInfo:
        """Who a request runs as: its key, or on a front-end key the end user (or account) it names."""
        if not key.front_end.enabled or key.id is None or key.user_id is not None:
            return key  # untrusted: whatever it names, the key is the tenant and pays
        names = given_names(headers, body_user)
        if not names:
            return key
        if key.front_end.accounts:
            person = await self._account(names)
            if person is not None:
                if person.suspended:
                    raise AuthenticationFailed(
                        f"the account {person.username!r} is suspended", code="account_suspended"
                    )
                return await self.plans.apply(dataclasses.replace(key, user_id=person.id))
        return await self._end_user(key, names[0])

    async def end_users(self, key_id: int) -> list[EndUserView]:
        """A key's end users, the most recently seen first (the admin's view)."""
        async with self.sessions() as session:
            if not 0 < key_id <= SQLITE_INT_MAX or await session.get(ApiKey, key_id) is None:
                raise NotFound(f"no API key with id {key_id}", param="key_id")
            rows = await session.scalars(
                select(EndUser)
                .where(EndUser.key_id == key_id)
                .order_by(EndUser.last_used_at.desc().nulls_last(), EndUser.name)
            )
            return [
                EndUserView(
                    r.id,
                    r.name,
                    r.plan_id,
                    r.used_tokens,
                    r.reserved_tokens,
                    r.total_tokens,
                    r.total_requests,
                    r.first_seen_at,
                    r.last_used_at,
                )
                for r in rows
            ]

    async def _account(self, names: list[str]) -> User | None:
        """The person whose user name the first of the names is that names one who may be spoken for: role user (an
        admin's power is never one header away)."""
        wanted = [n.strip().lower() for n in names]
        async with self.sessions() as session:
            found = await session.scalars(select(User).where(User.username.in_(wanted), User.role == "user"))
            by_name = {p.username: p for p in found}
        return next((by_name[n] for n in wanted if n in by_name), None)

    async def _end_user(self, key: KeyInfo, name: str) -> KeyInfo:
        key_id = key.stored_id
        row, plan = await self._row(key_id, name, key.front_end.plan_id)
        # No end-user plan: the key's own limits, for each end user.
        limits, models = (key.limits, key.models) if plan is None else (plan.limits, plan.models)
        return key.running_under(limits, models, row.first_seen_at, end_user_id=row.id, end_user=name)

    async def _row(self, key_id: int, name: str, default_plan: int | None) -> tuple[EndUser, PlanInfo | None]:
        """The end user's row (made at their first request) and their plan: their own, else the front end's."""
        by_name = select(EndUser).where(EndUser.key_id == key_id, EndUser.name == name)
        for _ in range(2):  # a first request racing another of the same new end user: the loser reads its row
            try:
                async with self.sessions.begin() as session:
                    row = await session.scalar(by_name)
                    if row is None:
                        now = utcnow()
                        row = EndUser(
                            key_id=key_id,
                            name=name,
                            period_start=now,
                            used_tokens=0,
                            reserved_tokens=0,
                            total_tokens=0,
                            total_requests=0,
                            first_seen_at=now,
                        )
                        session.add(row)
                        await session.flush()
                    plan_id = row.plan_id if row.plan_id is not None else default_plan
                    plan = None if plan_id is None else await session.get(Plan, plan_id)
                    return row, None if plan is None else PlanInfo.of(plan)
            except IntegrityError:
                continue
        raise InvalidRequest(f"the end user {name!r} could not be recorded; retry", param="user")
