"""The embedding model in its own process: vectors equal sentence-transformers' own, batching changes nothing,
over-long input and unearned `dimensions` are refused clearly, and a killed process comes back."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from engine import (
    AsyncEmbeddingClient,
    ContextLengthError,
    EmbeddingConfig,
    EngineDeadError,
    EngineState,
    InvalidRequestError,
    ModelLoadError,
)
from engine.embed.layout import default_embedding_model_path

pytestmark = pytest.mark.asyncio(loop_scope="module")
TEXTS = ["The cat sat on the mat.", "Embeddings map text to vectors.", "a", "Ünïcödé and emoji 🚀 survive"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client() -> AsyncEmbeddingClient:
    """One process for the module (each start costs seconds); the test that kills it waits for the restart."""
    c = AsyncEmbeddingClient(EmbeddingConfig(), auto_restart=True)
    await c.start()
    yield c  # type: ignore[misc]
    await c.shutdown()


async def test_model_info_names_the_bundled_model(client: AsyncEmbeddingClient) -> None:
    info = client.model_info
    assert info is not None
    assert (info.name, info.dimensions, info.max_input_tokens) == ("all-MiniLM-L6-v2", 384, 254)
    assert (info.pooling, info.normalized, info.matryoshka) == ("mean", True, False)


async def test_vectors_equal_the_reference_implementation(client: AsyncEmbeddingClient) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(default_embedding_model_path()), device="cpu").encode(TEXTS)
    ours = (await client.embed(TEXTS)).vectors
    assert ours.dtype == np.float32 and ours.shape == (len(TEXTS), 384)
    cosine = (ours * reference).sum(axis=1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() > 0.9999
    assert np.abs(ours - reference).max() < 1e-5


async def test_identical_inputs_identical_vectors_and_batching_changes_nothing(client: AsyncEmbeddingClient) -> None:
    batch = await client.embed([*TEXTS, TEXTS[0]])
    assert np.array_equal(batch.vectors[0], batch.vectors[-1])
    alone = [await client.embed([text]) for text in TEXTS]
    for i, one in enumerate(alone):
        assert np.abs(one.vectors[0] - batch.vectors[i]).max() < 1e-6
        assert one.token_counts == [batch.token_counts[i]]
    together = await asyncio.gather(*(client.embed([text]) for text in TEXTS))  # concurrent requests share passes
    for i, one in enumerate(together):
        assert np.abs(one.vectors[0] - batch.vectors[i]).max() < 1e-6


async def test_token_ids_embed_as_their_text_does(client: AsyncEmbeddingClient) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model_path())
    ids = tokenizer(TEXTS[1], add_special_tokens=False)["input_ids"]
    by_text, by_ids = await client.embed([TEXTS[1]]), await client.embed([ids])
    assert by_ids.token_counts == by_text.token_counts == [len(ids)]
    assert np.abs(by_ids.vectors - by_text.vectors).max() < 1e-6
    with pytest.raises(InvalidRequestError, match="token id 999999"):
        await client.embed([[101, 999999]])
    with pytest.raises(InvalidRequestError, match="neither a text nor"):
        await client.embed([[1.5, 2]])  # type: ignore[list-item]


async def test_over_long_input_is_refused_naming_the_limit_or_cut_when_asked(client: AsyncEmbeddingClient) -> None:
    long = "word " * 300
    with pytest.raises(ContextLengthError, match=r"input 1 has 300 tokens; .* at most 254"):
        await client.embed(["short", long])
    cut = await client.embed(["short", long], truncate=True)
    assert cut.token_counts[1] == 254
    again = await client.embed(["short"])  # the refusal left the process serving
    assert np.abs(again.vectors[0] - cut.vectors[0]).max() < 1e-6
    with pytest.raises(InvalidRequestError, match="at least one"):
        await client.embed([])


async def test_dimensions_refused_for_a_model_not_matryoshka_trained(client: AsyncEmbeddingClient) -> None:
    with pytest.raises(InvalidRequestError, match="not Matryoshka-trained") as refused:
        await client.embed(["hello"], dimensions=128)
    assert refused.value.param == "dimensions"
    with pytest.raises(InvalidRequestError, match="from 1 to 384"):
        await client.embed(["hello"], dimensions=1000)
    full = await client.embed(["hello"], dimensions=384)  # the model's own size is no cut
    assert full.vectors.shape == (1, 384)


async def test_a_killed_process_fails_clearly_and_comes_back(client: AsyncEmbeddingClient) -> None:
    before = (await client.embed(TEXTS[:1])).vectors
    pid = client.pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 5
    while client.state == EngineState.READY and loop.time() < deadline:
        await asyncio.sleep(0.02)
    with pytest.raises(EngineDeadError):
        await client.embed(TEXTS[:1])
    deadline = loop.time() + 60
    while client.state != EngineState.READY:
        assert loop.time() < deadline, "the embedding process did not come back"
        await asyncio.sleep(0.1)
    assert client.pid != pid and client.restarts == 1
    assert np.array_equal((await client.embed(TEXTS[:1])).vectors, before)


async def test_a_missing_model_fails_the_start_with_its_reason(tmp_path: Path) -> None:
    c = AsyncEmbeddingClient(EmbeddingConfig(model=str(tmp_path)), auto_restart=False)
    with pytest.raises(ModelLoadError, match=r"no config\.json"):
        await c.start()
    assert c.state == EngineState.DOWN
    await c.shutdown()
