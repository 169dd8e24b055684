"""Guided decoding through the whole engine: output under a JSON schema always parses and validates (even from
a random model), json_object gives an object, max_tokens still cuts, unconstrained neighbours are untouched, a
preempted request keeps its grammar state, a huge schema compiling stalls nobody, bad schemas are refused."""

from __future__ import annotations

import json
import time
from typing import Any

import jsonschema_rs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import (
    LLM,
    AsyncEngineClient,
    EngineConfig,
    GuidedDecoding,
    InvalidRequestError,
    SamplingParams,
    validate_guided,
)
from engine.sample.guided import MAX_SCHEMA_BYTES

TINY = EngineConfig(model="random:tiny", quantization="none", dtype="float32", device="cpu", num_kv_blocks=512)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(TINY)


def schema_of(schema: dict[str, Any]) -> GuidedDecoding:
    return GuidedDecoding(kind="json_schema", schema=json.dumps(schema))


def assert_valid(text: str, schema: dict[str, Any]) -> None:
    value = json.loads(text)
    errors = [e.message for e in jsonschema_rs.validator_for(schema).iter_errors(value)]
    assert not errors, (text, errors)


# -- generated schemas ------------------------------------------------------------------------------------

_words = st.text(alphabet="abcdefghij", min_size=1, max_size=6)
_scalars = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 8)),
    # Numbers bounded too: a random model left free writes digits until max_tokens (and 1e99999 parses as inf).
    st.builds(lambda lo: {"type": "integer", "minimum": lo, "maximum": lo + 50}, st.integers(-100, 100)),
    st.builds(lambda lo: {"type": "number", "minimum": lo, "maximum": lo + 10}, st.integers(-100, 100)),
    st.just({"type": "boolean"}),
    st.builds(lambda vs: {"enum": vs}, st.lists(_words, min_size=1, max_size=4, unique=True)),
)


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


def _objects(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    props = st.dictionaries(_words, values, min_size=1, max_size=4)
    return props.flatmap(
        lambda p: st.builds(lambda req: _object(p, req), st.lists(st.sampled_from(sorted(p)), unique=True))
    )


def _arrays(values: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, values, st.integers(1, 3))


_values = st.recursive(_scalars, lambda inner: st.one_of(_objects(inner), _arrays(inner)), max_leaves=6)
SCHEMAS = _objects(_values)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(0, 2**32))
def test_output_under_a_generated_schema_always_validates(llm: LLM, schema: dict[str, Any], seed: int) -> None:
    guided = schema_of(schema)
    params = [SamplingParams(max_tokens=600, temperature=1.0, seed=seed + i, guided=guided) for i in range(2)]
    for result in llm.generate(["Answer in JSON:", "{"], params):
        assert result.finish_reason == "stop", result.text
        assert_valid(result.text, schema)


# -- the knobs around it ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol() -> LLM:
    return LLM(EngineConfig(model="default", quantization="none", dtype="float32", device="cpu", num_kv_blocks=256))


def test_the_bundled_model_answers_json_object_and_json_schema_requests(smol: LLM) -> None:
    schema = _object({"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer"}}, ["name", "age"])
    prompt = smol.chat_prompt(
        [{"role": "user", "content": "Reply with a JSON object with two keys, name and age, for Tom who is 30."}]
    )
    as_object, as_schema = smol.generate(
        [prompt, prompt],
        [
            SamplingParams(max_tokens=100, temperature=0.0, guided=GuidedDecoding(kind="json_object")),
            SamplingParams(max_tokens=100, temperature=0.0, guided=schema_of(schema)),
        ],
    )
    assert as_object.finish_reason == "stop" and json.loads(as_object.text) == {"name": "Tom", "age": 30}
    assert as_schema.finish_reason == "stop"
    assert_valid(as_schema.text, schema)


def test_max_tokens_cuts_a_constrained_request_with_length(llm: LLM) -> None:
    guided = schema_of(_object({"text": {"type": "string", "minLength": 50, "maxLength": 60}}, ["text"]))
    result = llm.generate(["x"], SamplingParams(max_tokens=4, temperature=0.0, guided=guided))[0]
    assert result.finish_reason == "length" and len(result.token_ids) == 4
    assert result.text.startswith('{"text"')


def test_a_complete_output_ends_the_request_even_when_eos_is_ignored(llm: LLM) -> None:
    schema = _object({"ok": {"type": "boolean"}}, ["ok"])
    result = llm.generate(["x"], SamplingParams(max_tokens=100, ignore_eos=True, guided=schema_of(schema)))[0]
    assert result.finish_reason == "stop" and len(result.token_ids) < 100
    assert_valid(result.text, schema)


def test_unconstrained_neighbours_keep_their_greedy_output(llm: LLM) -> None:
    plain = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = ["The weather today", "Numbers: 1, 2,"]
    alone = [r.token_ids for r in llm.generate(prompts, plain)]
    schema = _object({"city": {"type": "string", "maxLength": 30}, "warm": {"type": "boolean"}}, ["city", "warm"])
    constrained = SamplingParams(max_tokens=300, temperature=0.0, guided=schema_of(schema))
    llm.generate(["warm the grammar cache"], constrained)  # so all three start in the same step
    mixed = llm.generate([prompts[0], "Weather as JSON", prompts[1]], [plain, constrained, plain])
    assert [mixed[0].token_ids, mixed[2].token_ids] == alone
    assert_valid(mixed[1].text, schema)


def test_a_preempted_request_keeps_its_grammar_state() -> None:
    """Four long constrained outputs in a pool too small for all of them: requests are evicted and recomputed
    with their output kept, and each output still validates and equals the output it has alone."""
    schema = _object(
        {
            "items": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
            "n": {"type": "integer"},
        },
        ["items", "n"],
    )
    llm = LLM(
        EngineConfig(
            model="random:tiny", quantization="none", dtype="float32", device="cpu", num_kv_blocks=6, block_size=8
        )
    )
    params = [SamplingParams(max_tokens=40, temperature=1.0, seed=s, guided=schema_of(schema)) for s in range(4)]
    alone = [llm.generate(["List:"], p)[0] for p in params]
    crowded = llm.generate(["List:"] * 4, params)
    assert llm.core.scheduler.num_preemptions > 0
    for a, c in zip(alone, crowded, strict=True):
        assert c.token_ids == a.token_ids
        if c.finish_reason == "stop":
            assert_valid(c.text, schema)


# -- refusals ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ('{"type": "bogus"}', "bogus"),
        ('{"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}', "missing"),
        (json.dumps({"description": "x" * MAX_SCHEMA_BYTES}), "bytes"),
    ],
)
def test_validate_guided_refuses_what_cannot_be_compiled(schema: str, says: str) -> None:
    with pytest.raises(InvalidRequestError, match=says) as caught:
        validate_guided(GuidedDecoding(kind="json_schema", schema=schema))
    assert caught.value.param == "response_format"


def test_the_engine_refuses_a_bad_schema_it_meets_and_goes_on(llm: LLM) -> None:
    bad = SamplingParams(max_tokens=10, guided=GuidedDecoding(kind="json_schema", schema='{"type": "bogus"}'))
    for _ in range(2):  # compiling on the worker, then from the cache at once
        with pytest.raises(InvalidRequestError, match="bogus"):
            llm.generate(["x"], bad)
    assert llm.generate(["x"], SamplingParams(max_tokens=3, ignore_eos=True))[0].finish_reason == "length"


async def test_a_served_client_sees_the_refusal_and_the_engine_serves_on() -> None:
    client = AsyncEngineClient(TINY, auto_restart=False)
    await client.start()
    try:
        bad = SamplingParams(max_tokens=10, guided=GuidedDecoding(kind="json_schema", schema='{"type": "bogus"}'))
        with pytest.raises(InvalidRequestError, match="bogus") as caught:
            _ = [o async for o in client.generate("x", bad)]
        assert caught.value.param == "response_format"
        schema = _object({"ok": {"type": "boolean"}}, ["ok"])
        good = SamplingParams(max_tokens=50, temperature=0.0, guided=schema_of(schema))
        assert_valid("".join([o.text async for o in client.generate("x", good)]), schema)
    finally:
        await client.shutdown()


def test_a_huge_schema_compiling_does_not_stall_other_requests(llm: LLM) -> None:
    """Last in the module: the compile it starts keeps the grammar worker busy for seconds."""
    fields = {f"f{j}": {"type": ["string", "integer", "boolean"], "maxLength": 40} for j in range(10)}
    schema = _object({f"field_{i}": _object(fields, list(fields)) for i in range(70)}, [])
    huge = GuidedDecoding(kind="json_schema", schema=json.dumps(schema))
    validate_guided(huge)  # within the size bound: a schema a client may send
    core = llm.core
    core.add_request("huge", [1, 2, 3], SamplingParams(max_tokens=50, guided=huge))
    core.add_request("plain", [1, 2, 3], SamplingParams(max_tokens=30, ignore_eos=True))
    started = time.monotonic()
    tokens = 0
    while "plain" in core.scheduler.requests:
        tokens += sum(len(o.token_ids) for o in core.step() if o.request_id == "plain")
    assert tokens == 30
    assert "huge" in core.scheduler.held, f"the compile finished within {time.monotonic() - started:.2f} s"
    assert core.abort(["huge"])[0].finish_reason == "abort"
    assert not core.has_work()
