"""Tools into the prompt (the template's own tools= or the fallback prompt), the model's format read from its
template, and the grammar behind forced choices."""

import json
from typing import Any

import pytest

from tests.web.test_tools_parse import TIME, TOOLS, WEATHER
from web.errors import InvalidRequest
from web.tools import AUTO, ToolChoice, ToolPlan, ToolSpec, constraint, detect_format, template_inputs, tool_spec
from web.tools.conversation import hf_call, unmatched_tool_result


class Template:
    def __init__(self, text: str | None) -> None:
        self.chat_template = text


PLAIN = Template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>{% endfor %}")
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris and the time?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            hf_call("call_1", "get_weather", '{"city": "Paris"}', "p"),
            hf_call("call_2", "get_time", {}, "p"),
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "noon"},
]  # fmt: skip


@pytest.mark.parametrize(
    ("template", "fmt"),
    [
        (PLAIN.chat_template, "hermes"),
        (None, "hermes"),
        ("{% if tools %}<tool_call>{{ tools | tojson }}</tool_call>{% endif %}", "hermes"),
        ("{% if tools %}<|python_tag|>{% endif %}", "llama3"),
        ('{% if tools %}{"name": ..., "parameters": ...}{% endif %}', "llama3"),
        ("{% if tools %}[AVAILABLE_TOOLS][TOOL_CALLS]{% endif %}", "mistral"),
    ],
)
def test_format_from_the_template(template: str | None, fmt: str) -> None:
    assert detect_format(Template(template)) == fmt


def test_fallback_prompt_lists_the_tools_and_spells_out_history() -> None:
    plan = ToolPlan(TOOLS, AUTO)
    inputs = template_inputs(HISTORY, plan, PLAIN)
    assert inputs["tools"] is None
    system, user, assistant, results = inputs["conversation"]
    assert system["role"] == "system" and "<tool_call>" in system["content"]
    assert json.dumps(WEATHER.as_openai()) in system["content"]
    assert user == HISTORY[0]
    blocks = assistant["content"].split("\n</tool_call>\n<tool_call>\n")
    assert json.loads(blocks[0].removeprefix("<tool_call>\n")) == {
        "name": "get_weather",
        "arguments": {"city": "Paris"},
    }
    # consecutive results are one user turn (templates that insist on alternation)
    assert results == {
        "role": "user",
        "content": "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response>",
    }
    own = template_inputs([{"role": "system", "content": "Be brief."}, HISTORY[0]], plan, PLAIN)["conversation"]
    assert own[0]["content"].startswith("Be brief.\n\n# Tools") and len(own) == 2
    none = template_inputs(HISTORY[:1], ToolPlan(TOOLS, ToolChoice("none")), PLAIN)["conversation"]
    assert none == HISTORY[:1]  # tool_choice none: the model is told of no tools


def test_tool_template_gets_tools_and_hf_history() -> None:
    inputs = template_inputs(HISTORY, ToolPlan(TOOLS, AUTO), Template("{{ tools }}"))
    assert inputs["conversation"] is HISTORY
    assert [t["function"]["name"] for t in inputs["tools"]] == ["get_weather", "get_time"]
    assert HISTORY[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}


def test_conversation_checks() -> None:
    with pytest.raises(InvalidRequest) as bad:
        hf_call("c", "get_time", "[1]", "messages[1].tool_calls[0].function.arguments")
    assert bad.value.param == "messages[1].tool_calls[0].function.arguments"
    assert unmatched_tool_result(HISTORY) is None
    assert unmatched_tool_result([*HISTORY, {"role": "tool", "tool_call_id": "call_9", "content": ""}]) == 4
    assert unmatched_tool_result([HISTORY[2]]) == 0  # a result before any call


def test_forced_choices_constrain_to_the_arguments_schema() -> None:
    named = constraint(TOOLS, ToolChoice("named", "get_weather"), True)
    assert named is not None and json.loads(named.schema) == WEATHER.parameters
    required = constraint(TOOLS, ToolChoice("required"), True)
    assert required is not None
    schema = json.loads(required.schema)
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [c["properties"]["name"]["const"] for c in schema["items"]["anyOf"]]
    assert names == ["get_weather", "get_time"]
    one = constraint((TIME,), ToolChoice("required"), False)
    assert one is not None and json.loads(one.schema)["properties"]["arguments"] == TIME.parameters
    assert constraint(TOOLS, AUTO, True) is None


def test_bad_tools_are_refused_naming_the_field() -> None:
    with pytest.raises(InvalidRequest) as name:
        tool_spec("get weather!", None, None, "tools[0].function.name", "tools[0].function.parameters")
    assert name.value.param == "tools[0].function.name"
    with pytest.raises(InvalidRequest) as kind:
        tool_spec("f", None, {"type": "array"}, "tools[1].function.name", "tools[1].function.parameters")
    assert kind.value.param == "tools[1].function.parameters"
    broken = ToolSpec("f", None, {"type": "object", "properties": {"a": {"type": "no-such-type"}}}, "tools[1].x")
    with pytest.raises(InvalidRequest) as schema:
        constraint((WEATHER, broken), ToolChoice("required"), True)
    assert schema.value.param == "tools[1].x"


def test_a_schema_nested_past_the_recursion_limit_is_refused() -> None:
    deep: dict[str, Any] = {"type": "object"}
    inner = deep
    for _ in range(5000):
        inner["items"] = {}
        inner = inner["items"]
    with pytest.raises(InvalidRequest) as nested:
        tool_spec("f", None, deep, "tools[0].function.name", "tools[0].function.parameters")
    assert nested.value.param == "tools[0].function.parameters"


def test_a_tool_template_renders_tools_and_calls_through_transformers() -> None:
    """transformers' own apply_chat_template with a (minimal, our own) tool-aware template: the tools reach it as
    `tools`, an assistant's calls with their arguments as a dict, a result with its call's id."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tokenizer.chat_template = (
        "{% for t in tools or [] %}<tool {{ t.function.name }}>{% endfor %}{% for m in messages %}[{{ m.role }}]"
        "{{ m.content }}{% for c in m.tool_calls or [] %}<call {{ c.function.name }} {{ c.function.arguments.city }}>"
        "{% endfor %}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{% endfor %}"
    )
    inputs = template_inputs(HISTORY, ToolPlan(TOOLS, AUTO), tokenizer)
    rendered = tokenizer.apply_chat_template(inputs["conversation"], tools=inputs["tools"], tokenize=False)
    assert rendered == (
        "<tool get_weather><tool get_time>[user]Weather in Paris and the time?"
        "[assistant]<call get_weather Paris><call get_time >[tool]sunny(call_1)[tool]noon(call_2)"
    )
