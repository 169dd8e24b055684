"""Settings: environment and env file, types, defaults, errors that name the variable, secrets kept out."""

from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

from appliance.settings import Settings, SettingsError, load_settings, settings_table
from appliance.wiring import engine_config, web_config
from engine import ConfigError
from web.db import alembic_config


def test_defaults_without_environment() -> None:
    s = load_settings({})
    assert (s.host, s.port, s.model, s.quantization) == ("127.0.0.1", 8000, "default", "auto")
    assert s.drain_timeout == 30.0 and s.history_retention_days == 30 and s.store_text is False
    assert s.admin_password is None and s.num_kv_blocks is None


def test_environment_values_are_typed() -> None:
    s = load_settings(
        {
            "APPLIANCE_PORT": "9001",
            "APPLIANCE_STORE_TEXT": "yes",
            "APPLIANCE_DRAIN_TIMEOUT": "2.5",
            "APPLIANCE_NUM_KV_BLOCKS": "1_024",
            "APPLIANCE_MAX_MODEL_LEN": "",
        }
    )
    assert s.port == 9001 and s.store_text is True and s.drain_timeout == 2.5
    assert s.num_kv_blocks == 1024 and s.max_model_len is None


def test_env_file_is_read_and_environment_wins(tmp_path: Path) -> None:
    env_file = tmp_path / "appliance.env"
    env_file.write_text(
        '# comment\nAPPLIANCE_PORT=9100\nexport APPLIANCE_MODEL="random:tiny"\n\nAPPLIANCE_HOST=0.0.0.0\n'
    )
    s = load_settings({"APPLIANCE_ENV_FILE": str(env_file), "APPLIANCE_HOST": "10.0.0.2"})
    assert (s.port, s.model, s.host) == (9100, "random:tiny", "10.0.0.2")


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"APPLIANCE_PORT": "eighty"}, "APPLIANCE_PORT"),
        ({"APPLIANCE_PORT": "0"}, "APPLIANCE_PORT"),
        ({"APPLIANCE_STORE_TEXT": "maybe"}, "APPLIANCE_STORE_TEXT"),
        ({"APPLIANCE_DRAIN_TIMEOUT": "-1"}, "APPLIANCE_DRAIN_TIMEOUT"),
        ({"APPLIANCE_PROT": "80"}, "APPLIANCE_PROT"),
        ({"APPLIANCE_ENV_FILE": "/nonexistent/appliance.env"}, "APPLIANCE_ENV_FILE"),
        ({"APPLIANCE_MAX_TOKENS_POLICY": "clip"}, "APPLIANCE_MAX_TOKENS_POLICY"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError, match=names):
        load_settings(env)


def test_max_tokens_policy_reaches_the_web_config() -> None:
    assert web_config(load_settings({})).trim_max_tokens is True
    assert web_config(load_settings({"APPLIANCE_MAX_TOKENS_POLICY": "refuse"})).trim_max_tokens is False


def test_engine_settings_are_checked_by_the_engine_config() -> None:
    with pytest.raises(ConfigError, match="quantization"):
        engine_config(load_settings({"APPLIANCE_QUANTIZATION": "int3"}))


def test_secrets_stay_out_of_repr_but_reach_the_web_config() -> None:
    s = load_settings({"APPLIANCE_ADMIN_PASSWORD": "hunter2-secret", "APPLIANCE_METRICS_TOKEN": "tok-secret"})
    assert "hunter2-secret" not in repr(s) and "tok-secret" not in repr(s)
    config = web_config(s)
    assert config.admin_password == "hunter2-secret" and "hunter2-secret" not in repr(config)


def test_settings_table_lists_every_setting_with_a_description() -> None:
    table = settings_table()
    assert [row.variable for row in table] == ["APPLIANCE_" + f.upper() for f in Settings.__dataclass_fields__]
    assert all(row.description and row.default for row in table)
    by_name = {row.variable: row for row in table}
    assert by_name["APPLIANCE_HOST"].default == "127.0.0.1"
    assert by_name["APPLIANCE_STORE_TEXT"].default == "false"


def test_engine_config_takes_the_limits_and_the_model_cache(tmp_path: Path) -> None:
    s = load_settings(
        {"APPLIANCE_DATA_DIR": str(tmp_path), "APPLIANCE_MAX_NUM_SEQS": "8", "APPLIANCE_QUANTIZATION": "none"}
    )
    config = engine_config(s)
    assert config.max_num_seqs == 8 and config.quantization == "none"
    assert config.cache_dir == str(tmp_path / "models")
    assert web_config(s).database_url.endswith(str(tmp_path / "appliance.db"))


def test_cli_prints_the_settings_table(capsys: pytest.CaptureFixture[str]) -> None:
    from appliance.cli.main import main

    main(["settings"])
    out = capsys.readouterr().out
    assert out.startswith("| Variable |") and "`APPLIANCE_DRAIN_TIMEOUT`" in out


def test_cli_migrate_and_set_admin_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import sqlite3

    from appliance.cli.main import main

    monkeypatch.setenv("APPLIANCE_DATA_DIR", str(tmp_path))
    main(["migrate"])
    conn = sqlite3.connect(tmp_path / "appliance.db")
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert conn.execute("SELECT version_num FROM alembic_version").fetchone()[0] == head
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    with pytest.raises(SystemExit, match="at least 8"):
        main(["set-admin-password"])
    monkeypatch.setattr("sys.stdin", io.StringIO("a-long-enough-password\n"))
    main(["set-admin-password"])
    (stored,) = conn.execute("SELECT password_hash FROM users WHERE username = 'admin' AND role = 'admin'").fetchone()
    assert stored.startswith("scrypt$") and "a-long-enough-password" not in stored
    monkeypatch.setenv("APPLIANCE_PORT", "not-a-port")
    with pytest.raises(SystemExit, match="APPLIANCE_PORT"):
        main(["migrate"])
