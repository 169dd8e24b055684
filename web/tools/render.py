"""Tools and tool turns into the chat template: the template's own `tools=` where it has tool support, else the
fallback below, which tells the model of the tools in the system prompt and asks for Hermes-style blocks (the
README's "Tool calls" section shows it). Messages come in the HF shape (web/tools/conversation.py)."""

from __future__ import annotations

import json
from typing import Any

from web.tools.formats import HERMES_CLOSE, HERMES_OPEN, supports_tools
from web.tools.plan import ToolPlan

FALLBACK_HEAD = (
    "# Tools\n\nYou may call one or more functions to help with the user's request. "
    "The functions, one JSON object each:\n<tools>\n"
)
FALLBACK_ASK = (
    "\n</tools>\n\nTo call a function, answer with a JSON object holding its name and arguments between "
    f"{HERMES_OPEN} and {HERMES_CLOSE} tags, one block per call:\n"
    f'{HERMES_OPEN}\n{{"name": <function-name>, "arguments": <arguments-json-object>}}\n{HERMES_CLOSE}'
)


def template_inputs(messages: list[dict[str, Any]], plan: ToolPlan, tokenizer: Any) -> dict[str, Any]:
    """apply_chat_template's `conversation` and `tools` for this plan and this model's template."""
    if supports_tools(tokenizer):
        tools = [t.as_openai() for t in plan.rendered]
        return {"conversation": messages, "tools": tools or None}
    return {"conversation": fallback_messages(messages, plan), "tools": None}


def fallback_prompt(plan: ToolPlan) -> str:
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in plan.rendered)
    return FALLBACK_HEAD + listed + FALLBACK_ASK


def _call_block(call: dict[str, Any]) -> str:
    function = call["function"]
    body = json.dumps({"name": function["name"], "arguments": function["arguments"]}, ensure_ascii=False)
    return f"{HERMES_OPEN}\n{body}\n{HERMES_CLOSE}"


def fallback_messages(messages: list[dict[str, Any]], plan: ToolPlan) -> list[dict[str, str]]:
    """Plain role + text messages for a template that knows nothing of tools: the tool list joins the system
    message (or opens one); an assistant's calls become the blocks the fallback asks for; tool results become a
    user turn of <tool_response> blocks (one turn for consecutive results: some templates insist on alternation)."""
    out: list[dict[str, str]] = []
    after_tool = False
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_tool = True
            continue
        after_tool = False
        content = m.get("content") or ""
        blocks = [_call_block(c) for c in m.get("tool_calls") or ()]
        out.append({"role": m["role"], "content": "\n".join([content, *blocks] if content else blocks)})
    if plan.rendered:
        prompt = fallback_prompt(plan)
        if out and out[0]["role"] == "system":
            out[0]["content"] += "\n\n" + prompt
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
