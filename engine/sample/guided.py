"""Guided decoding's grammars: the pure check a server runs before admission, and the engine's compiled-grammar
cache, which compiles off the step loop (xgrammar, on CPU).

xgrammar is imported on first use: it pulls in torch, which a web process that never sees response_format
should not pay for.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from engine.errors import InvalidRequestError
from engine.sampling_params import GuidedDecoding

if TYPE_CHECKING:
    import xgrammar

MAX_SCHEMA_BYTES = 64 * 1024  # a schema this big already takes seconds to compile on one core
GRAMMAR_CACHE_SIZE = 64  # compiled grammars kept (each holds a per-token mask cache: up to a few MB)
PARAM = "response_format"
# JSON on one line with the usual separators (", ", ": "): any whitespace lets a small model loop on newlines
# until max_tokens, and a bound on it (max_whitespace_cnt) makes every structural position cost ~0.1 ms per
# row in the step's bitmask fill (xgrammar 0.2.8, 49k vocabulary), where compact JSON costs ~1 us.
WHITESPACE: dict[str, Any] = {"any_whitespace": False}
# Any JSON object: a schema with no properties, not strict (strict would allow only {}).
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# xgrammar's messages start with a timestamp and its C++ source position: not for the client.
_SOURCE_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


def validate_guided(guided: GuidedDecoding) -> None:
    """Refuse a constraint the engine could not compile: InvalidRequestError naming the problem, param
    "response_format". Pure (no tokenizer), cheap next to a compile; a server calls it before admission."""
    _grammar(guided)


def _grammar(guided: GuidedDecoding) -> xgrammar.Grammar:
    import xgrammar

    if guided.kind == "json_object":
        return xgrammar.Grammar.from_json_schema(JSON_OBJECT_SCHEMA, strict_mode=False, **WHITESPACE)
    size = len(guided.schema.encode())
    if size > MAX_SCHEMA_BYTES:
        raise InvalidRequestError(f"the JSON schema is {size} bytes; at most {MAX_SCHEMA_BYTES} are accepted", PARAM)
    try:
        parsed = json.loads(guided.schema)
    except ValueError as exc:
        raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}", PARAM) from None
    if not isinstance(parsed, dict):
        raise InvalidRequestError(f"the JSON schema must be an object, not {type(parsed).__name__}", PARAM)
    try:
        return xgrammar.Grammar.from_json_schema(guided.schema, **WHITESPACE)
    except (RuntimeError, ValueError) as exc:
        raise InvalidRequestError(f"the JSON schema cannot be enforced: {_clean(exc)}", PARAM) from None


def refusal(grammar: Future[xgrammar.CompiledGrammar]) -> InvalidRequestError | None:
    """Why a finished compile cannot serve its requests (None when it can): its own InvalidRequestError, or
    any other failure (the tokenizer, memory) said as one, so the client always hears the reason."""
    exc = grammar.exception()
    if exc is None or isinstance(exc, InvalidRequestError):
        return exc
    return InvalidRequestError(f"the grammar could not be compiled: {type(exc).__name__}: {exc}", PARAM)


def _clean(exc: Exception) -> str:
    return _SOURCE_PREFIX.sub("", str(exc).strip())


class GrammarCache:
    """Compiled grammars by (kind, schema), least recently used dropped beyond GRAMMAR_CACHE_SIZE. Compiling
    runs on one worker thread (xgrammar releases the GIL), so a huge schema delays only its own requests.

    The compiler is built on the worker too, at the first guided request: an engine that never sees one
    never imports xgrammar."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_token_ids: list[int]) -> None:
        """vocab_size: the model's logits width, which may exceed len(tokenizer) (padded embeddings)."""
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._stop_token_ids = stop_token_ids
        self._compiler: xgrammar.GrammarCompiler | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        self._cache: OrderedDict[tuple[str, str], Future[xgrammar.CompiledGrammar]] = OrderedDict()
        self._lock = threading.Lock()  # the cache is read by the step loop only; the lock guards the compiler

    def get(self, guided: GuidedDecoding) -> Future[xgrammar.CompiledGrammar]:
        """The compiled grammar, at once when cached; its exception is an InvalidRequestError when the
        constraint is refused."""
        key = (guided.kind, guided.schema)
        future = self._cache.get(key)
        if future is not None:
            self._cache.move_to_end(key)
            return future
        future = self._pool.submit(self._compile, guided)
        self._cache[key] = future
        if len(self._cache) > GRAMMAR_CACHE_SIZE:
            self._cache.popitem(last=False)  # requests still waiting on it hold their own reference
        return future

    def _compile(self, guided: GuidedDecoding) -> xgrammar.CompiledGrammar:
        grammar = _grammar(guided)
        try:
            return self._get_compiler().compile_grammar(grammar)
        except (RuntimeError, ValueError) as exc:
            raise InvalidRequestError(f"the JSON schema cannot be enforced: {_clean(exc)}", PARAM) from None

    def _get_compiler(self) -> xgrammar.GrammarCompiler:
        import xgrammar

        with self._lock:
            if self._compiler is None:
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self._tokenizer, vocab_size=self.vocab_size, stop_token_ids=self._stop_token_ids
                )
                # Our LRU bounds the memory; xgrammar's own cache has no bound by default.
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
