"""How people get accounts besides the admin making one: a one-use invite link, self sign-up (only where the
operator allows it, and then pending until approved), and a CSV import of many at once."""

from __future__ import annotations

import csv
import hashlib
import io
import secrets
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import AppError, InvalidRequest, NameTaken, NotFound
from web.models import Invite, Plan, User, utcnow
from web.people.accounts import ROLES, Accounts, Person, hashed, normal_username, usage_row

INVITE_DAYS = 7
MAX_IMPORT_ROWS = 1000
CSV_COLUMNS = ("username", "password", "role", "plan")


class SignUpClosed(AppError):
    status_code = 403
    type = "invalid_request_error"
    code = "sign_up_closed"


@dataclass(slots=True)
class ImportReport:
    created: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # "line 3: the user name 'x' is taken"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


class Enrolment:
    def __init__(self, accounts: Accounts, sessions: async_sessionmaker[AsyncSession], self_signup: bool) -> None:
        self.accounts = accounts
        self.sessions = sessions
        self.self_signup = self_signup

    async def invite(self, role: str = "user", plan_id: int | None = None, days: int = INVITE_DAYS) -> str:
        """A one-use token for /invite/<token>; only its sha256 is kept."""
        if role not in ROLES:
            raise InvalidRequest(f"role must be one of {', '.join(ROLES)}", param="role")
        if not 1 <= days <= 90:
            raise InvalidRequest("an invite lasts 1 to 90 days", param="days")
        token, now = secrets.token_urlsafe(24), utcnow()
        try:
            async with self.sessions.begin() as session:
                session.add(
                    Invite(
                        token_hash=_digest(token),
                        role=role,
                        plan_id=plan_id,
                        created_at=now,
                        expires_at=now + timedelta(days=days),
                    )
                )
        except IntegrityError:
            raise NotFound(f"no plan with id {plan_id}", param="plan_id") from None
        return token

    async def invite_is_open(self, token: str) -> bool:
        async with self.sessions() as session:
            row = await session.get(Invite, _digest(token))
        return row is not None and row.used_by is None and row.expires_at > utcnow()

    async def redeem(self, token: str, username: str, password: str) -> Person:
        """The invite's account, made at once; the invite is spent in the same transaction (two tabs racing for
        one invite make one account)."""
        name, password_hash = normal_username(username), await hashed(password)
        now = utcnow()
        try:
            async with self.sessions.begin() as session:
                invite = await session.get(Invite, _digest(token))
                if invite is None or invite.used_by is not None or invite.expires_at <= now:
                    raise NotFound("this invite link is unknown, used or expired", param="token")
                user = User(
                    username=name,
                    password_hash=password_hash,
                    role=invite.role,
                    suspended=False,
                    plan_id=invite.plan_id,
                    overrides="{}",
                    created_at=now,
                    updated_at=now,
                )
                session.add(user)
                await session.flush()
                session.add(usage_row(user.id, now))
                spent = await session.execute(
                    update(Invite)
                    .where(Invite.token_hash == invite.token_hash, Invite.used_by.is_(None))
                    .values(used_by=user.id)
                )
                if not spent.rowcount:  # type: ignore[attr-defined]
                    raise NotFound("this invite link is unknown, used or expired", param="token")
        except IntegrityError:
            raise NameTaken(f"the user name {name!r} is taken", param="username") from None
        return Person.of(user)

    async def sign_up(self, username: str, password: str) -> Person:
        """A pending account: it signs in to nothing until the admin approves it."""
        if not self.self_signup:
            raise SignUpClosed("sign-up is closed: ask the administrator for an account or an invite")
        return await self.accounts.create(username, password, role="pending")

    async def import_csv(self, text: str) -> ImportReport:
        """Rows of username,password[,role[,plan name]] under that header; each row stands alone (a bad one is
        reported and skipped). Hashing costs ~0.3 s a person, two at a time."""
        report = ImportReport()
        reader = csv.reader(io.StringIO(text))
        try:
            lines = list(reader)
        except csv.Error as exc:  # a NUL byte, an unclosed quote: nothing is made from a file that does not parse
            report.errors.append(f"line {reader.line_num}: the CSV does not parse: {exc}")
            return report
        header = [name.strip().lower() for name in lines[0]] if lines else []
        if "username" not in header or "password" not in header or not set(header) <= set(CSV_COLUMNS):
            columns = ", ".join(CSV_COLUMNS)
            report.errors.append(f"line 1: the CSV needs a header line of {columns} (role and plan optional)")
            return report
        plans = await self._plan_ids()
        for line, values in enumerate(lines[1:], start=2):
            if not any(value.strip() for value in values):
                continue  # a blank line
            row = dict(zip(header, values, strict=False))
            if line - 1 > MAX_IMPORT_ROWS:
                report.errors.append(f"line {line}: stopped, at most {MAX_IMPORT_ROWS} people in one import")
                break
            plan_name = (row.get("plan") or "").strip()
            if plan_name and plan_name not in plans:
                report.errors.append(f"line {line}: no plan named {plan_name!r}")
                continue
            try:
                person = await self.accounts.create(
                    row.get("username") or "",
                    row.get("password") or "",
                    (row.get("role") or "user").strip().lower(),
                    plans.get(plan_name),
                )
            except AppError as exc:  # a bad or taken name, a short password, an unknown role
                report.errors.append(f"line {line}: {exc.message}")
                continue
            report.created.append(person.username)
        return report

    async def _plan_ids(self) -> dict[str, int]:
        async with self.sessions() as session:
            return {name: id_ for id_, name in await session.execute(select(Plan.id, Plan.name))}
