"""Who a verified ID token is here: the account linked to its (issuer, sub), made at the first sign-in under a
free user name, with its plan (and, where admin groups are set, its role) recomputed from its groups every time."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import AppError
from web.models import OidcIdentity, Plan, User, utcnow
from web.people.accounts import Accounts, Person, usage_row
from web.people.oidc.config import OidcConfig
from web.people.oidc.flow import SignOnFailed

NO_PASSWORD = "!sso"  # not a scrypt hash: no password ever matches it (web/people/passwords.py)
_NOT_NAME = re.compile(r"[^a-z0-9._@-]+")
NAME_TRIES = 50
MAX_GROUPS = 1000
MAX_SUBJECT = 255  # OpenID Connect Core 1.0, 2: at most 255 ASCII characters


def groups_of(claims: dict[str, Any], claim: str) -> list[str]:
    """The groups claim as a list of names (a single string is one group); anything else is no group."""
    value = claims.get(claim)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [group for group in value[:MAX_GROUPS] if isinstance(group, str)]
    return []


def wanted_name(claims: dict[str, Any]) -> str:
    """preferred_username, else email, else `user`, made a valid user name (web/people/accounts.py)."""
    for key in ("preferred_username", "email"):
        value = claims.get(key)
        if isinstance(value, str):
            name = _NOT_NAME.sub("-", value.strip().lower()).strip("-._@")[:56]
            if name:
                return name
    return "user"


def candidates(name: str) -> Iterator[str]:
    """alice, alice-2, alice-3, ...: the first free one is the new person's."""
    yield name
    for n in range(2, NAME_TRIES + 1):
        yield f"{name}-{n}"


class Identities:
    def __init__(self, config: OidcConfig, accounts: Accounts, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.config = config
        self.accounts = accounts
        self.sessions = sessions

    async def sign_in(self, claims: dict[str, Any]) -> Person:
        """The person these verified claims are, their plan and role brought in line with their groups now."""
        groups = groups_of(claims, self.config.groups_claim)
        plan_name = self.config.plan_of(groups)
        if plan_name is None:
            raise SignOnFailed("your account at the identity provider is in no group that may use this appliance")
        plan_id = await self._plan_id(plan_name)
        subject = str(claims["sub"])
        if len(subject) > MAX_SUBJECT:
            raise SignOnFailed("the identity provider's subject identifier is too long")
        person = await self._linked(subject)
        if person is None:
            person = await self._create(subject, wanted_name(claims), plan_id)
        try:
            if person.plan_id != plan_id:
                person = await self.accounts.set_plan(person.id, plan_id)
            role = self.config.role_of(groups, person.role)
            if role != person.role:
                person = await self.accounts.set_role(person.id, role)
        except AppError as exc:  # the last admin left the admin group: the console needs another admin first
            raise SignOnFailed(exc.message) from None
        return person

    async def _plan_id(self, name: str) -> int:
        async with self.sessions() as session:
            plan_id = await session.scalar(select(Plan.id).where(Plan.name == name))
        if plan_id is None:
            raise SignOnFailed(f"the plan {name!r} your groups give does not exist: tell the administrator")
        return plan_id

    async def _linked(self, subject: str) -> Person | None:
        async with self.sessions() as session:
            user = await session.scalar(
                select(User)
                .join(OidcIdentity, OidcIdentity.user_id == User.id)
                .where(OidcIdentity.issuer == self.config.issuer, OidcIdentity.subject == subject)
            )
        return None if user is None else Person.of(user)

    async def _create(self, subject: str, name: str, plan_id: int) -> Person:
        """The account and its link in one transaction, under the first free name; two first sign-ins of one
        person racing make one account (the link's primary key), and the loser signs in to it."""
        for candidate in candidates(name):
            if await self.accounts.by_name(candidate) is not None:
                continue
            now = utcnow()
            user = User(
                username=candidate,
                password_hash=NO_PASSWORD,
                role="user",
                suspended=False,
                plan_id=plan_id,
                overrides="{}",
                created_at=now,
                updated_at=now,
            )
            try:
                async with self.sessions.begin() as session:
                    session.add(user)
                    await session.flush()
                    session.add(usage_row(user.id, now))
                    session.add(
                        OidcIdentity(issuer=self.config.issuer, subject=subject, user_id=user.id, created_at=now)
                    )
            except IntegrityError:
                linked = await self._linked(subject)
                if linked is not None:
                    return linked
                continue  # the name was taken meanwhile
            return Person.of(user)
        raise SignOnFailed(f"no free user name like {name!r}: tell the administrator")
