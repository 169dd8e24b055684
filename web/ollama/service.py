"""Ollama's chat and generate bodies decoded and validated into the pipeline's Ask: the messages in the chat
template's shape (tool results tied to the calls they answer, in order, as Ollama's carry no ids), `options` as
the engine's sampling, `format` as the grammar, `tools` as a plan. Every refusal names its field."""

from __future__ import annotations

from typing import Any

import msgspec

from engine import GuidedDecoding
from web.backends.protocol import Served
from web.errors import InvalidRequest, UnsupportedParameter
from web.generation.decoding import BodyDecoder
from web.generation.prompts import Ask, Chat, Text, shown
from web.generation.sampling import Sampling, check_guided
from web.ollama.schemas import (
    ChatRequest,
    EmbedRequest,
    Format,
    GenerateRequest,
    LegacyEmbedRequest,
    Message,
    ModelRequest,
    Options,
)
from web.tools import ToolPlan, hf_call, tool_spec

decode_chat = BodyDecoder(ChatRequest)
decode_generate = BodyDecoder(GenerateRequest)
decode_embed = BodyDecoder(EmbedRequest)
decode_legacy_embed = BodyDecoder(LegacyEmbedRequest)
decode_model = BodyDecoder(ModelRequest)
ROLES = ("system", "user", "assistant", "tool")
# Ollama's own defaults where a client sends no option (its clients are written against them); repeat_penalty
# is not among them: Ollama's counts the last 64 tokens, the engine's (vLLM's) prompt and output, so 1.0 (off).
DEFAULTS = Options(temperature=0.8, top_p=0.9, top_k=40)
# The engine names its fields as SamplingParams does; Ollama's clients read theirs.
PARAM_NAMES = {
    "temperature": "options.temperature",
    "top_p": "options.top_p",
    "top_k": "options.top_k",
    "min_p": "options.min_p",
    "seed": "options.seed",
    "stop": "options.stop",
    "repetition_penalty": "options.repeat_penalty",
    "presence_penalty": "options.presence_penalty",
    "frequency_penalty": "options.frequency_penalty",
    "max_tokens": "options.num_predict",
}


def model_name(body: ModelRequest) -> str:
    name = body.model or body.name
    if not name:
        raise InvalidRequest("model is required", param="model")
    return name


def sampling_of(options: Options | None, guided: GuidedDecoding | None) -> tuple[Sampling, int | None]:
    """The options as the engine's sampling, and max_tokens (None: the server's default within the context)."""
    o = options or Options()
    pick = lambda name: getattr(o, name) if getattr(o, name) is not None else getattr(DEFAULTS, name)  # noqa: E731
    if o.num_predict == 0:
        raise InvalidRequest("num_predict must be at least 1, or -1 (up to the context)", param="options.num_predict")
    max_tokens = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    sampling = Sampling(
        temperature=pick("temperature"),
        top_p=pick("top_p"),
        top_k=pick("top_k"),
        min_p=o.min_p or 0.0,
        seed=o.seed if o.seed is not None and o.seed >= 0 else None,
        stop=tuple(o.stop or ()),
        repetition_penalty=1.0 if o.repeat_penalty is None else o.repeat_penalty,
        presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
        guided=guided,
    )
    return sampling, max_tokens


async def guided_of(fmt: Format | None) -> GuidedDecoding | None:
    """format "json" (any JSON object) or a JSON schema, as the engine's constraint, checked before admission."""
    if not fmt:
        return None
    guided = (
        GuidedDecoding(kind="json_object")
        if fmt == "json"
        else GuidedDecoding(kind="json_schema", schema=msgspec.json.encode(fmt).decode())
    )
    try:
        await check_guided(guided)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param="format") from None
    return guided


def check_think(think: object) -> None:
    if think not in (None, False):
        raise UnsupportedParameter("think is not supported: this server's model does not think", param="think")


async def chat_ask(body: ChatRequest, served: Served) -> Ask:
    check_think(body.think)
    specs = [
        tool_spec(
            t.function.name,
            t.function.description,
            t.function.parameters or {"type": "object", "properties": {}},
            f"tools[{i}].function.name",
            f"tools[{i}].function.parameters",
        )
        for i, t in enumerate(body.tools or ())
    ]
    plan = ToolPlan.of(specs, None, None, served.tokenizer)
    sampling, max_tokens = sampling_of(body.options, await guided_of(body.format))
    if sampling.guided is not None and plan.mode != "off":
        raise InvalidRequest("format cannot be combined with tools: both constrain the answer", param="format")
    return Ask(served, Chat(conversation(body.messages), plan), sampling, max_tokens)


async def generate_ask(body: GenerateRequest, served: Served) -> Ask:
    check_think(body.think)
    sampling, max_tokens = sampling_of(body.options, await guided_of(body.format))
    if body.raw:
        return Ask(served, Text(body.prompt), sampling, max_tokens)
    messages = [{"role": "system", "content": body.system}] if body.system else []
    messages.append({"role": "user", "content": body.prompt})
    return Ask(served, Chat(messages), sampling, max_tokens)


def conversation(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as the chat template takes them. Ollama's tool calls carry no ids: each call gets one here, and
    each tool message answers the earliest call of the turn before it that is not answered yet."""
    out: list[dict[str, Any]] = []
    unanswered: list[str] = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(f"role {shown(m.role)} is not one of {', '.join(ROLES)}", param=f"messages[{i}].role")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            if m.role != "assistant":
                raise InvalidRequest("only assistant messages carry tool_calls", param=f"messages[{i}].tool_calls")
            unanswered = [f"call_{i}_{j}" for j in range(len(m.tool_calls))]
            message["tool_calls"] = [
                hf_call(unanswered[j], c.function.name, c.function.arguments, f"messages[{i}].tool_calls[{j}]")
                for j, c in enumerate(m.tool_calls)
            ]
        if m.role == "tool":
            if not unanswered:
                raise InvalidRequest(
                    "a tool message must answer a tool call of an earlier assistant message", param=f"messages[{i}]"
                )
            message["tool_call_id"] = unanswered.pop(0)
            if m.tool_name:
                message["name"] = m.tool_name
        out.append(message)
    if not out:
        raise InvalidRequest("messages must hold one message at least", param="messages")
    return out
