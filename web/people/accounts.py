"""Accounts: people with a role (admin, user, pending), a scrypt password hash, a plan and their own overrides of
it; created by the admin, imported from CSV, by invite or by sign-up; approved, suspended, re-passworded, deleted.
The last active admin can be neither suspended, demoted nor deleted."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, get_args

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import InvalidRequest, LastAdmin, NameTaken, NotFound
from web.models import User, UserUsage, WebSession, utcnow
from web.people.passwords import check_new_password, hash_password
from web.people.plans import check_overrides

Role = Literal["admin", "user", "pending"]
ROLES: tuple[str, ...] = get_args(Role)
_USERNAME = re.compile(r"[a-z0-9][a-z0-9._@-]{0,63}")
SQLITE_INT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Person:
    """A user as the rest of the gateway sees them: no password hash."""

    id: int
    username: str
    role: str
    suspended: bool
    plan_id: int | None
    overrides: dict[str, Any]

    @classmethod
    def of(cls, row: User) -> Person:
        return cls(row.id, row.username, row.role, row.suspended, row.plan_id, json.loads(row.overrides or "{}"))

    @property
    def may_chat(self) -> bool:
        return not self.suspended and self.role in ("admin", "user")


def normal_username(username: str) -> str:
    """User names are compared lower-case: `Alice` and `alice` are one person."""
    name = username.strip().lower()
    if not _USERNAME.fullmatch(name):
        raise InvalidRequest(
            "a user name has 1 to 64 characters: letters, digits and . _ @ - (starting with a letter or digit)",
            param="username",
        )
    return name


async def _active_admins(session: AsyncSession) -> set[int]:
    """The admins who may sign in, locked until the transaction ends (FOR UPDATE on PostgreSQL; SQLite has one
    writer at a time, and a transaction whose read went stale meanwhile cannot write)."""
    active = select(User.id).where(User.role == "admin", User.suspended.is_(False)).with_for_update()
    return set(await session.scalars(active))


def _keep_an_admin(admins: set[int], row: User, gone: bool) -> None:
    """Refuse a change that leaves no active admin: no one could run the console or approve anyone."""
    still_admin = not gone and row.role == "admin" and not row.suspended
    if row.id in admins and not still_admin and admins == {row.id}:
        raise LastAdmin(
            f"{row.username!r} is the last active admin: make another person an admin first",
            param="user_id",
        )


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", param="role")


def usage_row(user_id: int, now: datetime) -> UserUsage:
    """A new person's quota state: nothing used, counted from now."""
    return UserUsage(
        user_id=user_id, period_start=now, used_tokens=0, reserved_tokens=0, total_tokens=0, total_requests=0
    )


async def hashed(password: str) -> str:
    problem = check_new_password(password)
    if problem:
        raise InvalidRequest(problem, param="password")
    return await asyncio.to_thread(hash_password, password)


class Accounts:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def create(self, username: str, password: str, role: str = "user", plan_id: int | None = None) -> Person:
        name = normal_username(username)
        _check_role(role)
        password_hash = await hashed(password)
        return await self.insert(name, password_hash, role, plan_id)

    async def insert(self, name: str, password_hash: str, role: str, plan_id: int | None) -> Person:
        """A new row from an already checked name and hash; a taken name is a 400 naming it."""
        now = utcnow()
        row = User(
            username=name,
            password_hash=password_hash,
            role=role,
            suspended=False,
            plan_id=plan_id,
            overrides="{}",
            created_at=now,
            updated_at=now,
        )
        try:
            async with self.sessions.begin() as session:
                session.add(row)
                await session.flush()
                session.add(usage_row(row.id, now))
        except IntegrityError:
            # The name is taken, or the plan does not exist (foreign key): say which.
            if await self.by_name(name) is not None:
                raise NameTaken(f"the user name {name!r} is taken", param="username") from None
            raise NotFound(f"no plan with id {plan_id}", param="plan_id") from None
        return Person.of(row)

    async def by_name(self, username: str) -> User | None:
        async with self.sessions() as session:
            return await session.scalar(select(User).where(User.username == username.strip().lower()))

    async def get(self, user_id: int) -> Person:
        async with self.sessions() as session:
            return Person.of(await self._row(session, user_id))

    async def find(self, user_id: int) -> Person | None:
        if not 0 < user_id <= SQLITE_INT_MAX:
            return None
        async with self.sessions() as session:
            row = await session.get(User, user_id)
        return None if row is None else Person.of(row)

    async def list(self) -> list[Person]:
        async with self.sessions() as session:
            return [Person.of(row) for row in await session.scalars(select(User).order_by(User.username))]

    async def names(self) -> dict[int, str]:
        """Every person's user name by id: the history and the live panel name a request's person."""
        async with self.sessions() as session:
            return {row.id: row.username for row in await session.execute(select(User.id, User.username))}

    async def set_role(self, user_id: int, role: str) -> Person:
        """Approving a pending sign-up is setting its role to user."""
        _check_role(role)
        return await self._change(user_id, role=role)

    async def set_suspended(self, user_id: int, suspended: bool) -> Person:
        """A suspended person is signed out everywhere at once; their keys stop working (web/keys)."""
        return await self._change(user_id, suspended=suspended, sign_out=suspended)

    async def set_plan(self, user_id: int, plan_id: int | None, overrides: dict[str, Any] | None = None) -> Person:
        values: dict[str, Any] = {"plan_id": plan_id}
        if overrides is not None:
            values["overrides"] = json.dumps(check_overrides(overrides), sort_keys=True)
        try:
            return await self._change(user_id, **values)
        except IntegrityError:
            raise NotFound(f"no plan with id {plan_id}", param="plan_id") from None

    async def set_password(self, user_id: int, password: str) -> Person:
        """A new password signs the person out everywhere: whoever knew the old one is out too."""
        return await self._change(user_id, password_hash=await hashed(password), sign_out=True)

    async def delete(self, user_id: int) -> None:
        """A person gone: their sessions, personal keys and usage with them (the database cascades); their history
        rows stay, naming no one."""
        async with self.sessions.begin() as session:
            admins = await _active_admins(session)
            row = await self._row(session, user_id)
            _keep_an_admin(admins, row, gone=True)
            await session.execute(delete(User).where(User.id == user_id))

    async def _change(self, user_id: int, sign_out: bool = False, **values: Any) -> Person:
        async with self.sessions.begin() as session:
            # Read (and locked) before the change: two admins suspending each other at once on PostgreSQL
            # would each see the other still active; the lock makes the second wait and see the first's change.
            admins = await _active_admins(session) if values.keys() & {"role", "suspended"} else None
            row = await self._row(session, user_id)
            for name, value in values.items():
                setattr(row, name, value)
            if admins is not None:
                _keep_an_admin(admins, row, gone=False)
            row.updated_at = utcnow()
            if sign_out:
                await session.execute(delete(WebSession).where(WebSession.user_id == user_id))
        return Person.of(row)

    async def _row(self, session: AsyncSession, user_id: int) -> User:
        row = await session.get(User, user_id) if 0 < user_id <= SQLITE_INT_MAX else None
        if row is None:
            raise NotFound(f"no user with id {user_id}", param="user_id")
        return row
