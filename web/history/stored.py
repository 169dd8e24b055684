"""Responses API answers kept for GET /v1/responses/{id} and previous_response_id (the stored_responses table,
text of the history's: pruned with it): only where the operator stores text (the store_text setting), and only for
the key that created them; any other key gets the 404 an unknown id gets. The body is the dialect's JSON
(web/responses/), kept as it was answered."""

from __future__ import annotations

import json
import logging
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import InvalidRequest, NotFound
from web.models import StoredResponse, utcnow

log = logging.getLogger("web.history")
SETTING = "store_text (APPLIANCE_STORE_TEXT)"


class ResponseStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], store_text: bool) -> None:
        self.sessions = sessions
        self.store_text = store_text

    async def keep(self, response_id: str, key_id: int, body: bytes, conversation: list[dict[str, Any]]) -> None:
        """Store an answer; a database that refuses it costs the client its later GET, never this answer."""
        text = json.dumps(conversation)
        row = StoredResponse(id=response_id, key_id=key_id, created_at=utcnow(), body=body.decode(), conversation=text)
        try:
            async with self.sessions.begin() as session:
                session.add(row)
        except Exception:
            log.exception("response %s could not be stored", response_id)

    async def body(self, response_id: str, key_id: int) -> bytes:
        return (await self._row(response_id, key_id, "response_id")).body.encode()

    async def conversation(self, response_id: str, key_id: int) -> list[dict[str, Any]]:
        """The conversation a previous response ended, to continue it."""
        if not self.store_text:
            raise InvalidRequest(
                f"previous_response_id needs stored responses, and this server stores no text (the setting "
                f"{SETTING} is off): send the whole conversation in input instead",
                param="previous_response_id",
            )
        try:
            row = await self._row(response_id, key_id, "previous_response_id")
        except NotFound as exc:  # OpenAI's answer: the request is at fault, not its URL
            code = "previous_response_not_found"
            raise InvalidRequest(exc.message, param="previous_response_id", code=code) from None
        return list(json.loads(row.conversation))

    async def delete(self, response_id: str, key_id: int) -> None:
        await self._row(response_id, key_id, "response_id")
        async with self.sessions.begin() as session:
            await session.execute(delete(StoredResponse).where(StoredResponse.id == response_id))

    async def _row(self, response_id: str, key_id: int, param: str) -> StoredResponse:
        async with self.sessions() as session:
            row = await session.scalar(
                select(StoredResponse).where(StoredResponse.id == response_id, StoredResponse.key_id == key_id)
            )
        if row is None:
            kept = "" if self.store_text else f" (this server keeps no responses: the setting {SETTING} is off)"
            shown = response_id if len(response_id) <= 64 else response_id[:64] + "..."
            raise NotFound(f"no response with id '{shown}'{kept}", param=param)
        return row
