"""Capacity in words: how many more chats of the current typical length the free KV blocks hold, e.g. "room for
about 40 more 2,000-token chats". The typical length is the median of the last finished requests' tokens (prompt
plus reply: the blocks a chat holds at its end, or only its window's where every layer of the model slides); with
no history yet, a 2,000-token chat is assumed and said so."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from engine import EngineStats
from web.history.record import Status
from web.models import RequestRecord

RECENT = 200  # finished requests the typical length is taken over
ASSUMED_CHAT_TOKENS = 2000


@dataclass(frozen=True, slots=True)
class Capacity:
    chats: int  # more chats of chat_tokens that fit in the free blocks
    chat_tokens: int
    measured: bool  # chat_tokens is the recent median, not the assumption

    @property
    def words(self) -> str:
        length = f"{self.chat_tokens:,}-token"
        typical = "" if self.measured else " (no finished requests yet to measure a typical one)"
        if self.chats == 0:
            return f"No room for another {length} chat until running ones free their blocks{typical}"
        return f"Room for about {self.chats:,} more {length} chat{'s' if self.chats != 1 else ''}{typical}"


async def typical_chat_tokens(sessions: async_sessionmaker[AsyncSession]) -> int | None:
    """The median tokens (prompt + completion) of the last RECENT finished requests; None when there are none."""
    recent = (
        select(RequestRecord.prompt_tokens + RequestRecord.completion_tokens)
        .where(RequestRecord.status == Status.FINISHED)
        .order_by(RequestRecord.arrival_at.desc())
        .limit(RECENT)
    )
    async with sessions() as session:
        lengths = [n for n in (await session.scalars(recent)).all() if n > 0]
    return round(statistics.median(lengths)) if lengths else None


def capacity(stats: EngineStats | None, typical: int | None) -> Capacity | None:
    if stats is None or stats.kv_blocks_total == 0:
        return None
    chat_tokens = typical or ASSUMED_CHAT_TOKENS
    free = max(stats.kv_blocks_total - stats.kv_blocks_used, 0)
    return Capacity(free // stats.blocks_per_chat(chat_tokens), chat_tokens, typical is not None)
