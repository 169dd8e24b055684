"""Server-side sessions of the chat page and the console, in the database (so several gateways share them and a
restart signs nobody out): the cookie carries a random id, the row only its sha256; the CSRF token is derived from
the id (a keyed hash), so it is never stored either. Idle and absolute expiry; sign-out here or everywhere."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.models import User, WebSession, utcnow
from web.people.accounts import Person
from web.people.plans import OWNER_COLUMNS, PLANS, Owner

IDLE_TIMEOUT_S = 60 * 60  # a page left without requests (polling counts) signs out after an hour
MAX_AGE_S = 12 * 60 * 60  # and any session ends after twelve hours, open page or not
TOUCH_EVERY_S = 60  # last_seen is written at most once a minute per session: a dashboard polls every 2 s
MAX_TOKEN_CHARS = 128


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def csrf_of(token: str) -> str:
    """The session's CSRF token: a keyed hash of its id, which the database never sees."""
    return hmac.new(token.encode(), b"csrf", hashlib.sha256).hexdigest()


def tokens_match(expected: str, presented: str | None) -> bool:
    return bool(presented) and hmac.compare_digest(expected.encode(), (presented or "").encode())


@dataclass(frozen=True, slots=True)
class SignedIn:
    """A live session and its person, for one request; with the person's standing and plan as their requests run
    where the session was read (`get`), not where it was just made."""

    token: str
    person: Person
    created_at: datetime
    owner: Owner | None = None

    @property
    def csrf_token(self) -> str:
        return csrf_of(self.token)


class SessionStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], clock: Callable[[], datetime] = utcnow) -> None:
        self.sessions = sessions
        self.clock = clock

    async def create(self, user_id: int, address: str | None = None) -> SignedIn:
        """A new session with a new random id (never one the browser brought: no fixation); expired rows of
        everyone are swept on the way."""
        token, now = secrets.token_urlsafe(32), self.clock()
        async with self.sessions.begin() as session:
            await session.execute(delete(WebSession).where(self._expired(now)))
            session.add(
                WebSession(id_hash=_digest(token), user_id=user_id, created_at=now, last_seen_at=now, address=address)
            )
            user = await session.get(User, user_id)
            assert user is not None, "a session is made for a person who exists"
            return SignedIn(token, Person.of(user), now)

    async def get(self, token: str | None) -> SignedIn | None:
        """The live session of a cookie value, its idle clock refreshed; None when unknown, expired, or its person
        is suspended."""
        if not token or len(token) > MAX_TOKEN_CHARS:
            return None
        digest, now = _digest(token), self.clock()
        async with self.sessions() as session:
            found = (
                await session.execute(
                    select(WebSession, User, *OWNER_COLUMNS)
                    .join(User, User.id == WebSession.user_id)
                    .outerjoin(PLANS, PLANS.c.id == User.plan_id)
                    .where(WebSession.id_hash == digest)
                )
            ).first()
        if found is None:
            return None
        row, user = found[0], found[1]
        if self._is_expired(row, now) or user.suspended:
            await self.end(token)
            return None
        if (now - row.last_seen_at).total_seconds() >= TOUCH_EVERY_S:
            async with self.sessions.begin() as session:
                await session.execute(update(WebSession).where(WebSession.id_hash == digest).values(last_seen_at=now))
        return SignedIn(token, Person.of(user), row.created_at, Owner.of(found))

    async def end(self, token: str | None) -> None:
        if token and len(token) <= MAX_TOKEN_CHARS:
            async with self.sessions.begin() as session:
                await session.execute(delete(WebSession).where(WebSession.id_hash == _digest(token)))

    async def end_all(self, user_id: int) -> int:
        """Sign a person out everywhere; returns how many sessions ended."""
        async with self.sessions.begin() as session:
            result = await session.execute(delete(WebSession).where(WebSession.user_id == user_id))
        return int(result.rowcount)  # type: ignore[attr-defined]

    async def count(self, user_id: int) -> int:
        async with self.sessions() as session:
            rows = await session.scalars(select(WebSession.id_hash).where(WebSession.user_id == user_id))
            return len(rows.all())

    @staticmethod
    def _is_expired(row: WebSession, now: datetime) -> bool:
        return (now - row.last_seen_at).total_seconds() > IDLE_TIMEOUT_S or (
            now - row.created_at
        ).total_seconds() > MAX_AGE_S

    @staticmethod
    def _expired(now: datetime) -> ColumnElement[bool]:
        return or_(
            WebSession.last_seen_at < now - timedelta(seconds=IDLE_TIMEOUT_S),
            WebSession.created_at < now - timedelta(seconds=MAX_AGE_S),
        )
