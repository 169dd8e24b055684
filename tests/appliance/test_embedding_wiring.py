"""APPLIANCE_EMBEDDING_MODEL: default, a directory or none; an embedding model that fails to start is logged and
leaves the rest serving."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from appliance.settings import SettingsError, load_settings
from appliance.wiring import embedding_client, start_embeddings
from engine import EngineState


def test_the_bundled_model_by_default_and_none_for_no_embeddings() -> None:
    client = embedding_client(load_settings({}))
    assert client is not None and client.config.model == "default" and client.config.threads == 1
    assert embedding_client(load_settings({"APPLIANCE_EMBEDDING_MODEL": "none"})) is None
    with pytest.raises(SettingsError, match="APPLIANCE_EMBEDDING_MODEL"):
        load_settings({"APPLIANCE_EMBEDDING_MODEL": ""})


async def test_a_model_that_fails_to_start_is_logged_not_raised(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    client = embedding_client(load_settings({"APPLIANCE_EMBEDDING_MODEL": str(tmp_path)}))
    assert client is not None
    with caplog.at_level(logging.ERROR, logger="appliance.wiring"):
        await start_embeddings(client)
    assert client.state == EngineState.DOWN
    assert "no embeddings" in caplog.text and "no config.json" in caplog.text
    await client.shutdown()
