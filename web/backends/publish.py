"""This appliance's tokenizer and chat template for the gateways in front of it: `GET /v1/tokenizer?model=NAME`
(with a key) returns the files a gateway needs to serve the model without a local copy (web/backends/fetched.py
reads them there)."""

import asyncio
from pathlib import Path
from typing import Annotated

from litestar import Router, get
from litestar.params import QueryParameter
from litestar.types import Guard
from msgspec import Struct

from web import deps
from web.backends.fetched import MAX_PUBLISHED_BYTES, PUBLISHED
from web.errors import ModelNotFound, NotFound


class TokenizerFiles(Struct, frozen=True):
    model: str
    files: dict[str, str]


def read_published(directory: Path) -> dict[str, str]:
    """The published files present in `directory`; NotFound where there is no tokenizer.json (a slow tokenizer
    needs its sentencepiece model, which this does not send)."""
    files = {name: (directory / name).read_text(encoding="utf-8") for name in PUBLISHED if (directory / name).is_file()}
    if "tokenizer.json" not in files:
        raise NotFound("this server's model has no tokenizer.json to publish (a slow tokenizer)")
    if sum(len(text) for text in files.values()) > MAX_PUBLISHED_BYTES:
        raise NotFound("this server's tokenizer is larger than a gateway accepts")
    return files


@get("/tokenizer")
async def tokenizer_files(gate: deps.Gate, model: Annotated[str, QueryParameter(max_length=256)]) -> TokenizerFiles:
    info = gate.client.model_info
    if info is None or model not in (info.name, gate.model_name):
        raise ModelNotFound(f"this server publishes the tokenizer of its own model only, not {model[:100]!r}")
    return TokenizerFiles(model, await asyncio.to_thread(read_published, Path(info.tokenizer_dir)))


def publish_router(authenticate: Guard) -> Router:
    return Router(path="/v1", route_handlers=[tokenizer_files], guards=[authenticate])
