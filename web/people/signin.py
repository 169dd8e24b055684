"""Checking a person's name and password: failed guesses limited per address and per account name, one answer
and the same scrypt work for an unknown name and a wrong password, old hashes re-hashed at today's cost."""

from __future__ import annotations

import asyncio
import hashlib
import hmac

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import RateLimited, SignInFailed
from web.models import User, utcnow
from web.people.accounts import Person
from web.people.passwords import MAX_PASSWORD_CHARS, hash_password, needs_rehash, nobodys_hash, verify_password
from web.system.login_limiter import LoginLimiter

WRONG = "wrong user name or password"
MEMO_LIMIT = 4096


class SignIn:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self.by_address = LoginLimiter()  # 5 failures a minute from one address
        # 10 failures in 5 minutes at one name, from anywhere (a botnet spreads over addresses); unknown names
        # are counted alike, so the limit says nothing about who exists.
        self.by_account = LoginLimiter(limit=10, window_s=300.0)
        # scrypt costs 0.3-1 s by design; a console polling with Basic every 2 s should not pay it each time.
        # sha256(stored hash + password) of successful checks; a new password changes the stored hash.
        self._verified: set[str] = set()

    async def authenticate(self, username: str, password: str, address: str) -> Person:
        """The person these are the name and password of, or SignInFailed (one message whatever was wrong), or
        RateLimited while the address or the name has failed too often (even with the right password: a guess
        must not learn it was right)."""
        account = username.strip().lower()[:64]
        wait = max(self.by_address.retry_after(address), self.by_account.retry_after(account))
        if wait:
            raise RateLimited(f"too many failed sign-ins; try again in {wait} s", headers={"Retry-After": str(wait)})
        person = await self._check(account, password[: MAX_PASSWORD_CHARS + 1])
        if person is None:
            self.by_address.failed(address)
            self.by_account.failed(account)
            raise SignInFailed(WRONG)
        self.by_address.succeeded(address)
        self.by_account.succeeded(account)
        return person

    async def _check(self, account: str, password: str) -> Person | None:
        async with self.sessions() as session:
            user = await session.scalar(select(User).where(User.username == account))
        stored = user.password_hash if user is not None else nobodys_hash()
        memo = hashlib.sha256(f"{stored}\0{password}".encode("utf-8", "surrogatepass")).hexdigest()
        if user is not None and memo in self._verified:
            return Person.of(user)
        if not await asyncio.to_thread(verify_password, password, stored) or user is None:
            return None
        if needs_rehash(stored):
            await self._rehash(user.id, stored, password)
        else:
            if len(self._verified) >= MEMO_LIMIT:
                self._verified.clear()
            self._verified.add(memo)
        return Person.of(user)

    async def _rehash(self, user_id: int, old: str, password: str) -> None:
        """Store the password hashed at today's cost in place of `old`, which it just matched; a password set
        meanwhile wins."""
        hashed = await asyncio.to_thread(hash_password, password)
        async with self.sessions.begin() as session:
            row = await session.get(User, user_id)
            if row is None or not hmac.compare_digest(row.password_hash, old):
                return
            await session.execute(
                update(User).where(User.id == user_id).values(password_hash=hashed, updated_at=utcnow())
            )
