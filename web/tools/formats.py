"""Which of the common families' tool-call formats a model writes, read from its chat template."""

from __future__ import annotations

from typing import Any, Literal

# hermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>, one block per call (Hermes, Qwen, and the
#   fallback prompt for templates without tool support);
# llama3: {"name": ..., "parameters": {...}} as the whole answer, optionally after <|python_tag|>, several
#   separated by ';' (Llama 3.1-3.3's JSON tool calling);
# mistral: [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (Mistral's v3 tokenizers).
ToolFormat = Literal["hermes", "llama3", "mistral"]

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
MISTRAL_MARKER = "[TOOL_CALLS]"


def template_text(tokenizer: Any) -> str:
    """The chat template's source ("" when the tokenizer has none); a dict of named templates counts whole."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


def supports_tools(tokenizer: Any) -> bool:
    """Whether the template renders `tools=`: one that never mentions `tools` cannot (SmolLM2's, for one), and gets
    the fallback prompt (web/tools/render.py). A backend's tokenizer (web/backends/remote_tokenizer.py) has no
    source to read: it says so itself, from a rendering that offered a tool."""
    renders = getattr(tokenizer, "renders_tools", None)
    if isinstance(renders, bool):
        return renders
    return "tools" in template_text(tokenizer)


def detect_format(tokenizer: Any) -> ToolFormat:
    """The format the template teaches its model; Hermes when the template is not a tool template (the fallback
    prompt asks for Hermes blocks)."""
    if not supports_tools(tokenizer):
        return "hermes"
    text = template_text(tokenizer)
    if MISTRAL_MARKER in text:
        return "mistral"
    if PYTHON_TAG in text or ('"parameters"' in text and HERMES_OPEN not in text):
        return "llama3"
    return "hermes"
