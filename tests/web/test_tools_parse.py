"""Model output into tool calls, per family (Hermes/Qwen, Llama 3 JSON, Mistral), and hostile output that must
stay content: malformed JSON, unknown names, arguments that are not an object, nesting past the recursion limit."""

import json

import pytest

from web.tools import AUTO, ToolChoice, ToolPlan, ToolSpec

WEATHER = ToolSpec("get_weather", "the weather", {"type": "object", "properties": {"city": {"type": "string"}}})
TIME = ToolSpec("get_time", None, {"type": "object", "properties": {}})
TOOLS = (WEATHER, TIME)


def plan(fmt: str = "hermes", choice: ToolChoice = AUTO, parallel: bool = True) -> ToolPlan:
    return ToolPlan(TOOLS, choice, parallel, fmt)  # type: ignore[arg-type]


def calls_of(text: str, p: ToolPlan) -> tuple[str | None, list[tuple[str, dict[str, object]]]]:
    parsed = p.parse(text)
    assert all(c.id.startswith("call_") and len(c.id) == 29 for c in parsed.calls)
    assert len({c.id for c in parsed.calls}) == len(parsed.calls)
    return parsed.content, [(c.name, json.loads(c.arguments)) for c in parsed.calls]


def test_hermes_parallel_calls_and_content() -> None:
    text = (
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    )
    assert calls_of(text, plan()) == ("Let me check.", [("get_weather", {"city": "Paris"}), ("get_time", {})])


def test_hermes_only_calls_gives_null_content_and_reads_an_unclosed_last_block() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    assert calls_of(text, plan()) == (None, [("get_weather", {"city": "Oslo"})])


def test_arguments_as_a_json_string_or_missing() -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}</tool_call>'
    assert calls_of(text, plan())[1] == [("get_weather", {"city": "Rome"})]
    assert calls_of('<tool_call>{"name": "get_time"}</tool_call>', plan())[1] == [("get_time", {})]


@pytest.mark.parametrize(
    "block",
    [
        '{"name": "get_weather", "arguments": {"city": "Paris"}',  # malformed JSON
        '{"name": "rm_rf", "arguments": {}}',  # not an offered function
        '{"name": "get_weather", "arguments": [1, 2]}',  # arguments not an object
        '{"name": "get_weather", "arguments": "not json"}',
        '{"name": 7, "arguments": {}}',
        '["get_weather"]',
        "[" * 100_000,  # past the recursion limit
    ],
)
def test_hermes_hostile_blocks_stay_content(block: str) -> None:
    text = f"Before <tool_call>{block}</tool_call> after"
    assert calls_of(text, plan()) == (text, [])


def test_llama3_json_with_and_without_python_tag() -> None:
    one = '{"name": "get_weather", "parameters": {"city": "Lima"}}'
    assert calls_of(one, plan("llama3")) == (None, [("get_weather", {"city": "Lima"})])
    two = (
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Lima"}}; {"name": "get_time", "parameters": {}}'
    )
    assert calls_of(two, plan("llama3"))[1] == [("get_weather", {"city": "Lima"}), ("get_time", {})]


@pytest.mark.parametrize(
    "text",
    [
        "The weather in Lima is sunny.",
        '{"name": "get_weather", "parameters": {"city": "Lima"}} and then some words',
        '{"name": "get_weather", "parameters": {"city": "Lima"}}; {"name": "nope", "parameters": {}}',
        '{"city": "Lima"}',
    ],
)
def test_llama3_prose_and_invalid_calls_stay_content(text: str) -> None:
    assert calls_of(text, plan("llama3")) == (text, [])


def test_mistral_tool_calls_after_content_and_bare() -> None:
    calls = '{"name": "get_weather", "arguments": {"city": "Bern"}}, {"name": "get_time", "arguments": {}}'
    text = f"Checking. [TOOL_CALLS][{calls}]"
    assert calls_of(text, plan("mistral")) == ("Checking.", [("get_weather", {"city": "Bern"}), ("get_time", {})])
    # The detokenizer drops [TOOL_CALLS] (a special token): the bare array is read too.
    bare = '[{"name": "get_weather", "arguments": {"city": "Bern"}}]'
    assert calls_of(bare, plan("mistral")) == (None, [("get_weather", {"city": "Bern"})])


def test_mistral_invalid_list_stays_content_whole() -> None:
    text = '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}, {"name": "nope", "arguments": {}}]'
    assert calls_of(text, plan("mistral")) == (text, [])
    assert calls_of("[1] is a citation", plan("mistral")) == ("[1] is a citation", [])


def test_named_choice_output_is_the_arguments() -> None:
    p = plan(choice=ToolChoice("named", "get_weather"))
    assert calls_of(' \n{"city": "Paris"}', p) == (None, [("get_weather", {"city": "Paris"})])
    assert p.parse("").calls == []


def test_required_choice_object_or_array() -> None:
    single = plan(choice=ToolChoice("required"), parallel=False)
    assert calls_of('{"name": "get_time", "arguments": {}}', single) == (None, [("get_time", {})])
    many = plan(choice=ToolChoice("required"))
    text = '[{"name": "get_weather", "arguments": {"city": "a\\"}]"}}, {"name": "get_time", "arguments": {}}]'
    assert calls_of(text, many) == (None, [("get_weather", {"city": 'a"}]'}), ("get_time", {})])
    # Without any call in it (a backend that ignored the grammar), the output is content.
    assert calls_of("I cannot do that.", many) == ("I cannot do that.", [])


def test_tool_choice_none_parses_nothing() -> None:
    text = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    assert calls_of(text, plan(choice=ToolChoice("none"))) == (text, [])


def test_without_parallel_calls_only_the_first_counts() -> None:
    text = (
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    assert calls_of(text, plan(parallel=False)) == (None, [("get_time", {})])
    assert calls_of(text, plan())[1] == [("get_time", {}), ("get_weather", {"city": "Oslo"})]
