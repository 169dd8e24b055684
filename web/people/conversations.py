"""A signed-in person's conversations, kept on the server: list (newest first, searched by title and text), create,
read, change settings, replace the messages, delete. Every query names the owner: another person's conversation is
found exactly as often as one that does not exist."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, exists, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import NotFound, PayloadTooLarge
from web.models import Conversation, ConversationMessage, utcnow

MAX_MESSAGES = 1000  # per conversation
MAX_CHARS = 500_000  # of message text per conversation (a long chat of a day; well under the 4 MiB body limit)
MAX_ID_CHARS = 32


@dataclass(frozen=True, slots=True)
class Message:
    role: str
    content: str
    created_at: datetime | None = None  # set when stored


@dataclass(frozen=True, slots=True)
class Settings:
    title: str
    system: str
    temperature: float
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    id: str
    settings: Settings
    created_at: datetime
    updated_at: datetime
    message_count: int
    messages: list[Message] | None = None  # only when one conversation is read

    @classmethod
    def of(cls, row: Conversation, count: int, messages: list[Message] | None = None) -> ConversationInfo:
        settings = Settings(row.title, row.system, row.temperature, row.max_tokens)
        return cls(row.id, settings, row.created_at, row.updated_at, count, messages)


def check_size(messages: list[Message]) -> None:
    """A conversation beyond the limits is refused whole (413): nothing of it is stored."""
    if len(messages) > MAX_MESSAGES:
        raise PayloadTooLarge(
            f"a conversation holds at most {MAX_MESSAGES} messages; start a new one", param="messages"
        )
    chars = sum(len(m.content) for m in messages)
    if chars > MAX_CHARS:
        raise PayloadTooLarge(
            f"a conversation holds at most {MAX_CHARS} characters of messages ({chars} given); start a new one",
            param="messages",
        )


def _missing() -> NotFound:
    return NotFound("no conversation with this id", param="conversation_id")


def _pattern(text: str) -> str:
    """`text` as a LIKE pattern that matches it anywhere, its own wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class Conversations:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def search(self, owner: int, q: str = "", limit: int = 50, offset: int = 0) -> list[ConversationInfo]:
        """Newest first; `q` (case-insensitive) in the title or in any message."""
        count = (
            select(func.count())
            .where(ConversationMessage.conversation_id == Conversation.id)
            .correlate(Conversation)
            .scalar_subquery()
        )
        query = select(Conversation, count).where(Conversation.user_id == owner)
        if q:
            pattern = _pattern(q)
            in_text = exists().where(
                ConversationMessage.conversation_id == Conversation.id,
                ConversationMessage.content.ilike(pattern, escape="\\"),
            )
            query = query.where(or_(Conversation.title.ilike(pattern, escape="\\"), in_text))
        query = query.order_by(Conversation.updated_at.desc(), Conversation.id).limit(limit).offset(offset)
        async with self.sessions() as session:
            return [ConversationInfo.of(row, n) for row, n in (await session.execute(query)).all()]

    async def create(self, owner: int, settings: Settings, messages: list[Message]) -> ConversationInfo:
        check_size(messages)
        now = utcnow()
        row = Conversation(
            id=secrets.token_urlsafe(18),  # 24 characters, 144 random bits
            user_id=owner,
            title=settings.title,
            system=settings.system,
            temperature=settings.temperature,
            max_tokens=settings.max_tokens,
            created_at=now,
            updated_at=now,
        )
        async with self.sessions.begin() as session:
            session.add(row)
            await session.flush()
            stored = self._insert(session, row.id, messages, 0, now)
        return ConversationInfo.of(row, len(stored), stored)

    async def get(self, owner: int, conversation_id: str) -> ConversationInfo:
        async with self.sessions() as session:
            row = await self._row(session, owner, conversation_id)
            messages = await self._messages(session, row.id)
        return ConversationInfo.of(row, len(messages), messages)

    async def update(self, owner: int, conversation_id: str, **changes: Any) -> ConversationInfo:
        """Title, system prompt, temperature, max_tokens: those given change, the others stay."""
        async with self.sessions.begin() as session:
            row = await self._row(session, owner, conversation_id, change=True)
            for name, value in changes.items():
                setattr(row, name, value)
            row.updated_at = utcnow()
            messages = await self._messages(session, row.id)
        return ConversationInfo.of(row, len(messages), messages)

    async def replace_messages(self, owner: int, conversation_id: str, messages: list[Message]) -> ConversationInfo:
        """The whole list, as the page holds it after a turn. Messages it shares with the stored list from the
        start keep their rows (and their time); from the first difference on, the stored ones give way."""
        check_size(messages)
        now = utcnow()
        async with self.sessions.begin() as session:
            row = await self._row(session, owner, conversation_id, change=True)
            stored = await self._messages(session, row.id)
            kept = 0
            while kept < min(len(stored), len(messages)) and (stored[kept].role, stored[kept].content) == (
                messages[kept].role,
                messages[kept].content,
            ):
                kept += 1
            await session.execute(
                delete(ConversationMessage).where(
                    ConversationMessage.conversation_id == row.id, ConversationMessage.position >= kept
                )
            )
            added = self._insert(session, row.id, messages[kept:], kept, now)
            row.updated_at = now
        result = stored[:kept] + added
        return ConversationInfo.of(row, len(result), result)

    async def delete(self, owner: int, conversation_id: str) -> None:
        async with self.sessions.begin() as session:
            await session.delete(await self._row(session, owner, conversation_id, change=True))

    async def delete_all(self, owner: int) -> int:
        """Every conversation of this person (and, by the foreign key, their messages); how many went."""
        async with self.sessions.begin() as session:
            result = await session.execute(delete(Conversation).where(Conversation.user_id == owner))
        return int(result.rowcount)  # type: ignore[attr-defined]

    @staticmethod
    def _insert(
        session: AsyncSession, conversation_id: str, messages: list[Message], start: int, now: datetime
    ) -> list[Message]:
        stored = [Message(m.role, m.content, now) for m in messages]
        session.add_all(
            ConversationMessage(
                conversation_id=conversation_id, position=start + i, role=m.role, content=m.content, created_at=now
            )
            for i, m in enumerate(stored)
        )
        return stored

    @staticmethod
    async def _messages(session: AsyncSession, conversation_id: str) -> list[Message]:
        rows = await session.scalars(
            select(ConversationMessage)
            .where(ConversationMessage.conversation_id == conversation_id)
            .order_by(ConversationMessage.position)
        )
        return [Message(r.role, r.content, r.created_at) for r in rows]

    @staticmethod
    async def _row(session: AsyncSession, owner: int, conversation_id: str, change: bool = False) -> Conversation:
        """The owner's conversation; another's, or none, is the same 404. To change it, its row is locked first
        (PostgreSQL): two browsers saving it at once take turns instead of colliding on its message rows."""
        if not conversation_id or len(conversation_id) > MAX_ID_CHARS:
            raise _missing()
        query = select(Conversation).where(Conversation.id == conversation_id, Conversation.user_id == owner)
        row = await session.scalar(query.with_for_update() if change else query)
        if row is None:
            raise _missing()
        return row
