"""The OpenAI routes' bodies in the OpenAPI document (web/system/openapi.py) where msgspec's generated schema
cannot say it: a chat message's role-dependent fields, a completion's prompt, counts sent as floats, token ids
below the vocabulary size, and the template names the server refuses."""

from __future__ import annotations

from typing import Any

from web.openai.schemas import RESERVED_TEMPLATE_NAMES, ROLES


def _text_parts(content: dict[str, Any]) -> dict[str, Any]:
    """content's document with only the parts the server takes: text (the others are declared to be refused as
    unsupported, web/openai/service.py)."""
    lists = [t for t in content["anyOf"] if t.get("type") == "array"]
    text = {**lists[0], "items": {"$ref": lists[0]["items"]["discriminator"]["mapping"]["text"]}}
    return {**content, "anyOf": [text if t is lists[0] else t for t in content["anyOf"]]}


def message_schema(generated: dict[str, Any]) -> dict[str, Any]:
    """A chat message's document from msgspec's (ROLES is checked by web/openai/service.py): msgspec cannot say
    that every role but the assistant's needs content, that only the assistant's carry tool_calls, or that a tool
    result needs the tool_call_id of the call it answers (an earlier one: no schema can say that)."""
    props = {**generated["properties"], "content": _text_parts(generated["properties"]["content"])}
    content = {"anyOf": [t for t in props["content"]["anyOf"] if t != {"type": "null"}]}
    plain = {k: v for k, v in props.items() if k not in ("tool_calls", "tool_call_id")}
    speakers = {"enum": [r for r in ROLES if r not in ("assistant", "tool")]}
    speaker = {
        **generated,
        "required": ["role", "content"],
        "properties": {**plain, "role": speakers, "content": content},
    }
    call_id = {"type": "string", "minLength": 1, "maxLength": 256}
    result = {
        **generated,
        "required": ["role", "content", "tool_call_id"],
        "properties": {**plain, "role": {"const": "tool"}, "content": content, "tool_call_id": call_id},
    }
    assistant = {**generated, "required": ["role"], "properties": {**props, "role": {"const": "assistant"}}}
    return {"anyOf": [speaker, result, assistant]}


def prompt_schema(vocab: int | None) -> dict[str, Any]:
    """A completion's prompt: a string, token ids (below the vocabulary size, where known), or a batch of one of
    those (a batch of more is refused as such). msgspec cannot type it: it takes no union of two list types."""
    token = {"type": "integer", "minimum": 0} | ({"maximum": vocab - 1} if vocab else {})
    text = {"type": "string", "minLength": 1}
    tokens = {"type": "array", "minItems": 1, "items": token}
    one = {"type": "array", "minItems": 1, "maxItems": 1, "items": {"anyOf": [text, tokens]}}
    return {"anyOf": [text, tokens, one]}


def max_tokens_schema(maximum: int | None) -> dict[str, Any]:
    """A token count's document: JSON Schema's integer already takes 5.0 (a number with no fraction), which is
    what MaxTokens decodes; msgspec would document its float branch as any number."""
    count = {"type": "integer", "minimum": 1} | ({"maximum": maximum} if maximum else {})
    return {"anyOf": [count, {"type": "null"}], "default": None}


def ids_below(limit: int) -> str:
    """A regular expression of the decimal numbers 0 .. limit - 1 written without leading zeros (a vocabulary's
    token ids, as logit_bias spells them): JSON Schema has no numeric bound on a property's name."""
    top = str(limit - 1)
    shorter = [] if len(top) == 1 else ["0", f"[1-9][0-9]{{0,{len(top) - 2}}}"]
    same = [top]
    for i, digit in enumerate(top):
        lowest = 1 if i == 0 and len(top) > 1 else 0
        if int(digit) > lowest:
            rest = len(top) - i - 1
            same.append(f"{top[:i]}[{lowest}-{int(digit) - 1}]" + (f"[0-9]{{{rest}}}" if rest else ""))
    return "^(" + "|".join(shorter + same) + ")$"


def logit_bias_schema(generated: dict[str, Any], vocab: int | None) -> dict[str, Any]:
    """logit_bias's document with its token ids below the vocabulary size, where known."""
    if not vocab:
        return generated
    mapping = next(t for t in generated["anyOf"] if t.get("type") == "object")
    bounded = {**mapping, "propertyNames": {"pattern": ids_below(vocab)}}
    return {**generated, "anyOf": [bounded if t is mapping else t for t in generated["anyOf"]]}


def template_kwargs_schema(generated: dict[str, Any]) -> dict[str, Any]:
    """chat_template_kwargs' document with the names the server refuses (web/openai/service.py)."""
    mapping = next(t for t in generated["anyOf"] if t.get("type") == "object")
    taken = {"anyOf": [{"enum": sorted(RESERVED_TEMPLATE_NAMES)}, {"pattern": "_tokens?$"}]}
    names = {**mapping["propertyNames"], "not": taken}
    return {
        **generated,
        "anyOf": [{**mapping, "propertyNames": names} if t is mapping else t for t in generated["anyOf"]],
    }


# stream_options means something only for a stream: OpenAI and vLLM refuse it otherwise (web/openai/service.py).
STREAM_OPTIONS_NEED_STREAM = {"stream_options": {"required": ["stream"], "properties": {"stream": {"const": True}}}}
