"""The streaming parser: any split of an answer into deltas gives the calls and content of the whole answer, and
no part of a call marker ever reaches the client as content."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.web.test_tools_parse import TOOLS
from web.tools import AUTO, CallDelta, ContentDelta, ToolChoice, ToolPlan, collect
from web.tools.formats import HERMES_OPEN, MISTRAL_MARKER, PYTHON_TAG

HERMES = (
    'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par<is>"}}\n</tool_call>\n'
    '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
)
ANSWERS = [
    ("hermes", AUTO, HERMES),
    ("hermes", AUTO, 'Use <tool_call>{"name": "nope", "arguments": {}}</tool_call> or <tool_ca'),
    ("llama3", AUTO, '<|python_tag|>{"name": "get_weather", "parameters": {"city": "x"}}; {"name": "get_time"}'),
    ("llama3", AUTO, "   Plain words, <|python_tag|> later."),
    ("mistral", AUTO, 'Hm [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "[TOOL_CALLS]"}}]'),
    ("hermes", ToolChoice("named", "get_weather"), '  {"city": "Ber\\"lin"}'),
    ("hermes", ToolChoice("required"),
     '[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "}"}}]'),
]  # fmt: skip


def split(text: str, cuts: list[int]) -> list[str]:
    points = sorted({c % (len(text) + 1) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def streamed(plan: ToolPlan, deltas: list[str]) -> list[ContentDelta | CallDelta]:
    stream = plan.stream()
    events = [e for d in deltas for e in stream.feed(d)]
    return events + stream.finish()


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(ANSWERS), st.lists(st.integers(min_value=0), max_size=12))
def test_any_split_gives_the_whole_answers_calls(answer: tuple[str, ToolChoice, str], cuts: list[int]) -> None:
    fmt, choice, text = answer
    plan = ToolPlan(TOOLS, choice, True, fmt)  # type: ignore[arg-type]
    whole = plan.parse(text)
    events = streamed(plan, split(text, cuts))
    parts = collect(events)
    assert parts.content == whole.content
    assert [(c.name, json.loads(c.arguments)) for c in parts.calls] == [
        (c.name, json.loads(c.arguments)) for c in whole.calls
    ]
    for e in events:
        if isinstance(e, CallDelta) and e.id is None:
            assert e.name is None and e.arguments  # later pieces carry only more arguments
    if whole.calls:  # no piece of a marker ever leaves as content when the answer holds calls
        shown = "".join(e.text for e in events if isinstance(e, ContentDelta))
        for marker in (HERMES_OPEN, PYTHON_TAG, MISTRAL_MARKER):
            assert marker not in shown


def test_content_streams_before_the_answer_ends_and_a_marker_start_is_held() -> None:
    stream = ToolPlan(TOOLS, AUTO, True, "hermes").stream()
    assert stream.feed("Hello") == [ContentDelta("Hello")]
    assert stream.feed(" <tool_") == []  # may begin <tool_call>: held back
    (call,) = stream.feed('call>{"name": "get_time", "arguments": {}}</tool_call>')
    assert isinstance(call, CallDelta) and call.index == 0 and call.name == "get_time" and call.id
    assert stream.finish() == []


def test_named_arguments_stream_as_they_come() -> None:
    stream = ToolPlan(TOOLS, ToolChoice("named", "get_weather"), True, "hermes").stream()
    assert stream.feed(" ") == []
    (first,) = stream.feed('{"ci')
    assert isinstance(first, CallDelta)
    assert (first.index, first.name, first.arguments) == (0, "get_weather", '{"ci')
    assert first.id is not None
    assert stream.feed('ty": "x"}') == [CallDelta(0, 'ty": "x"}')]
