"""A Responses body decoded and validated into the pipeline's Ask: its input items (and a previous response's
conversation) as the chat template's messages, its function tools (hosted ones ignored, namespace groups
flattened), tool_choice, text.format as the grammar, the sampling fields. Every refusal names its field."""

from __future__ import annotations

from typing import Any

import msgspec

from engine import GuidedDecoding, InvalidRequestError
from web.backends.protocol import Served
from web.errors import InvalidRequest, UnsupportedParameter
from web.generation.decoding import BodyDecoder
from web.generation.prompts import Ask, Chat
from web.generation.sampling import Sampling, check_guided, forced_tool_guided
from web.responses.schemas import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionChoice,
    FunctionTool,
    InputText,
    JsonObjectFormat,
    JsonSchemaFormat,
    MessageItem,
    OutputText,
    Part,
    Refusal,
    ResponsesRequest,
)
from web.tools import ToolChoice, ToolPlan, ToolSpec, hf_call, named_choice, tool_spec

_decode = BodyDecoder(ResponsesRequest)


def decode_body(raw: bytes) -> ResponsesRequest:
    """The body; a message item may leave out its type (OpenAI's "easy input message"), which is filled in."""
    try:
        value = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError, UnicodeDecodeError, ValueError):
        return _decode(raw)  # its refusal, in its words
    items = value.get("input") if isinstance(value, dict) else None
    if isinstance(items, list) and any(isinstance(i, dict) and "type" not in i and "role" in i for i in items):
        for item in items:
            if isinstance(item, dict) and "type" not in item and "role" in item:
                item["type"] = "message"
        raw = msgspec.json.encode(value)
    return _decode(raw)


def conversation(body: ResponsesRequest, prior: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The previous response's conversation, then the input items, as template messages (instructions apart)."""
    out = list(prior)
    calls = {c["id"] for m in prior for c in m.get("tool_calls") or ()}
    if isinstance(body.input, str):
        return [*out, {"role": "user", "content": body.input}]
    for i, item in enumerate(body.input):
        where = f"input[{i}]"
        if isinstance(item, MessageItem):
            role = "system" if item.role in ("system", "developer") else item.role
            out.append({"role": role, "content": _text(item.content, f"{where}.content")})
        elif isinstance(item, FunctionCallItem):
            call = hf_call(item.call_id, item.name, item.arguments, f"{where}.arguments")
            calls.add(item.call_id)
            if out and out[-1]["role"] == "assistant":  # the calls of one answer are one assistant turn
                out[-1] = {**out[-1], "tool_calls": [*(out[-1].get("tool_calls") or ()), call]}
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in calls:
                raise InvalidRequest(
                    f"{where} answers a function call that no earlier function_call item made (call_id "
                    f"'{item.call_id[:64]}')",
                    param=f"{where}.call_id",
                )
            out.append({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output, f"{where}.output")})
        # reasoning items replay another model's thinking: this model has none to continue, so they are dropped
    return out


def _text(content: str | list[Part], where: str) -> str:
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, InputText | OutputText):
            texts.append(part.text)
        elif isinstance(part, Refusal):
            texts.append(part.refusal)
        else:
            kind = type(part).__struct_config__.tag
            raise UnsupportedParameter(
                f"content parts of type '{kind}' are not supported: this server's model is text-only",
                param=f"{where}[{j}].type",
            )
    return "".join(texts)


def with_instructions(instructions: str | None, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The prompt's messages: instructions first, as the system message (joined with one the input starts with)."""
    if not instructions:
        return messages
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": instructions + "\n\n" + messages[0]["content"]}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]


def function_tools(body: ResponsesRequest) -> list[ToolSpec]:
    """The function tools, those of namespace groups too; hosted tools (web_search, file_search, ...) this
    server cannot run are left out."""
    specs = []
    for i, raw in enumerate(body.tools or ()):
        kind = raw.get("type")
        if kind == "function":
            specs.append(_function(raw, f"tools[{i}]"))
        elif kind == "namespace" and isinstance(raw.get("tools"), list):
            inner = raw["tools"]
            specs += [_function(t, f"tools[{i}].tools[{j}]") for j, t in enumerate(inner) if _is_function(t)]
    return specs


def _is_function(tool: Any) -> bool:
    return isinstance(tool, dict) and tool.get("type") == "function"


def _function(raw: dict[str, Any], where: str) -> ToolSpec:
    try:
        tool = msgspec.convert(raw, FunctionTool)
    except msgspec.ValidationError as exc:
        raise InvalidRequest(f"invalid function tool: {exc}", param=where) from None
    return tool_spec(tool.name, tool.description, tool.parameters, f"{where}.name", f"{where}.parameters")


def tool_plan(body: ResponsesRequest, tokenizer: Any) -> ToolPlan:
    specs = function_tools(body)
    choice: ToolChoice | None = None
    if isinstance(body.tool_choice, FunctionChoice):
        choice = named_choice(specs, body.tool_choice.name, "tool_choice.name")
    elif body.tool_choice == "required":
        if not specs:
            raise InvalidRequest("tool_choice required needs function tools; the request has none", param="tool_choice")
        choice = ToolChoice("required")
    elif body.tool_choice is not None and specs:
        choice = ToolChoice(body.tool_choice)
    return ToolPlan.of(specs, choice, body.parallel_tool_calls, tokenizer)


async def text_format(body: ResponsesRequest) -> GuidedDecoding | None:
    """text.format as the engine's constraint, checked before admission (text: none)."""
    form = body.text.format if body.text is not None else None
    if isinstance(form, JsonObjectFormat):
        return GuidedDecoding(kind="json_object")
    if not isinstance(form, JsonSchemaFormat):
        return None
    guided = GuidedDecoding(kind="json_schema", schema=msgspec.json.encode(form.schema).decode())
    try:
        await check_guided(guided)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.message, param="text.format.schema") from None
    except InvalidRequestError as exc:
        raise InvalidRequest(str(exc), param="text.format.schema") from None
    return guided


async def response_ask(body: ResponsesRequest, served: Served, messages: list[dict[str, Any]]) -> Ask:
    plan = tool_plan(body, served.tokenizer)
    guided = await text_format(body)
    if guided is not None and plan.mode in ("named", "required"):
        raise InvalidRequest(
            "text.format cannot be combined with tool_choice required or a named function: both constrain the "
            "whole output",
            param="tool_choice",
        )
    guided = await forced_tool_guided(plan, guided)
    top_k = body.top_k or 0
    sampling = Sampling(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=0 if top_k == -1 else top_k,
        seed=body.seed,
        min_p=body.min_p or 0.0,
        repetition_penalty=1.0 if body.repetition_penalty is None else body.repetition_penalty,
        presence_penalty=body.presence_penalty or 0.0,
        frequency_penalty=body.frequency_penalty or 0.0,
        guided=guided,
    )
    prompt = Chat(with_instructions(body.instructions, messages), plan)
    return Ask(served, prompt, sampling, body.max_output_tokens)
