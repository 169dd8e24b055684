"""APPLIANCE_BACKENDS as the appliance reads it: checked at start, its keys kept out of messages and reprs, and
the web room's config built from it."""

from __future__ import annotations

import sys

import pytest

from appliance.settings import SettingsError, load_settings
from appliance.wiring import engine_client, web_config
from web.app import build_router
from web.backends.none import NoLocalEngine


def test_a_bad_backends_entry_stops_the_start_naming_the_setting_not_the_key() -> None:
    with pytest.raises(SettingsError, match=r"APPLIANCE_BACKENDS: backend .* must be an http") as refused:
        load_settings({"APPLIANCE_BACKENDS": "embedded,ftp://:hunter2@10.0.0.5:21"})
    assert "hunter2" not in str(refused.value)


def test_backends_reach_the_web_config_and_a_remote_only_list_has_no_local_engine(tmp_path: object) -> None:
    env = {"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_MODEL": "random:tiny"}
    settings = load_settings(
        {**env, "APPLIANCE_BACKENDS": "http://:hunter2@10.0.0.5:8000", "APPLIANCE_STICKY_BACKENDS": "true"}
    )
    assert "hunter2" not in repr(settings)
    config = web_config(settings)
    assert not config.backends.embedded and config.backends.remotes[0].api_key == "hunter2" and config.sticky_backends
    assert "hunter2" not in repr(config)
    assert isinstance(engine_client(settings), NoLocalEngine)
    both = web_config(load_settings({**env, "APPLIANCE_BACKENDS": "embedded,http://10.0.0.5:8000"}))
    assert both.backends.embedded and both.local_backend_name == "embedded"
    assert not isinstance(engine_client(load_settings(env)), NoLocalEngine)


def test_the_managed_vllm_gets_seats_its_max_num_seqs_and_the_rest_wait_fairly(tmp_path: object) -> None:
    env = {"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_ENGINE": "vllm", "APPLIANCE_VLLM_PYTHON": sys.executable}
    config = web_config(load_settings({**env, "APPLIANCE_MAX_NUM_SEQS": "12"}))
    assert (config.local_backend_name, config.local_max_in_flight) == ("vllm", 12)
    router = build_router(config, NoLocalEngine(), lambda: "m")
    assert router.seats.limits["vllm"] == 12
    embedded = web_config(load_settings({"APPLIANCE_DATA_DIR": str(tmp_path)}))
    assert build_router(embedded, NoLocalEngine(), lambda: "m").seats.limits["embedded"] is None
