"""A person's own API keys: made, listed and revoked by the signed-in person alone. The keys keep no limits of
their own: their owner's plan gives them (web/people/plans.py) and their requests count against the owner."""

from __future__ import annotations

from sqlalchemy import func, select

from web.db import SQLITE_INT_MAX, SQLITE_INT_MIN
from web.errors import InvalidRequest, NotFound
from web.keys.info import KeyInfo, KeyLimits
from web.keys.service import KeyService
from web.models import ApiKey, utcnow

MAX_KEYS_PER_PERSON = 20


class PersonalKeys:
    def __init__(self, keys: KeyService) -> None:
        self.keys = keys

    async def create(self, user_id: int, name: str) -> tuple[KeyInfo, str]:
        """The key is in the answer once, never again."""
        async with self.keys.sessions() as session:
            live = await session.scalar(
                select(func.count()).where(ApiKey.user_id == user_id, ApiKey.revoked_at.is_(None))
            )
        if (live or 0) >= MAX_KEYS_PER_PERSON:
            raise InvalidRequest(f"you have {MAX_KEYS_PER_PERSON} keys already: revoke one first", param="name")
        return await self.keys.create(name[:200], KeyLimits(), user_id=user_id)

    async def of(self, user_id: int) -> list[KeyInfo]:
        """This person's keys, revoked ones too, newest first."""
        async with self.keys.sessions() as session:
            rows = await session.scalars(select(ApiKey).where(ApiKey.user_id == user_id).order_by(ApiKey.id.desc()))
            return [KeyInfo.of(row) for row in rows]

    async def revoke(self, user_id: int, key_id: int) -> KeyInfo:
        """Revoke one of this person's keys; another's, or none, is the same 404 (no telling which ids exist)."""
        async with self.keys.sessions.begin() as session:
            row = await session.get(ApiKey, key_id) if SQLITE_INT_MIN <= key_id <= SQLITE_INT_MAX else None
            if row is None or row.user_id != user_id:
                raise NotFound(f"you have no API key with id {key_id}", param="key_id")
            if row.revoked_at is None:
                row.revoked_at = utcnow()
        return KeyInfo.of(row)
