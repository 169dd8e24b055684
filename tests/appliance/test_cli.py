"""The command line's own behaviour: setting flags override the environment, secrets are not flags, the
admin password is prompted twice (or read from stdin), the old set-admin-password still works, `bench` passes
its options through, `assets fetch` needs no settings, and `settings` prints the README's table."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from appliance.cli.main import build_parser, settings_from
from tests.appliance.conftest import Cli
from web.static import VENDOR_DIR
from web.static.assets import ASSETS

REPO = Path(__file__).resolve().parents[2]


def test_serve_flags_override_the_environment(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("APPLIANCE_PORT", "8100")
    monkeypatch.setenv("APPLIANCE_MODEL", "random:tiny")
    args = build_parser().parse_args(["serve", "--port", "9001", "--max-num-seqs", "8", "--store-text", "yes"])
    settings = settings_from(args)
    assert (settings.port, settings.max_num_seqs, settings.store_text) == (9001, 8, True)
    assert settings.model == "random:tiny", "what the command line leaves alone comes from the environment"


def test_secrets_are_not_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = capsys.readouterr().out
    assert "--quantization" in help_text and "APPLIANCE_QUANTIZATION" in help_text
    assert "--admin-password" not in help_text and "--metrics-token" not in help_text


def test_a_bad_flag_value_names_the_setting(cli: Cli) -> None:
    result = cli("doctor", "--port", "eighty")
    assert result.code == 1 and "APPLIANCE_PORT must be a integer, not 'eighty'" in result.err


def test_admin_password_is_prompted_twice(cli: Cli, data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["first-password", "second-password", "same-password", "same-password"])
    monkeypatch.setattr("getpass.getpass", lambda prompt: next(answers))
    differ = cli("admin", "set-password", terminal=True)
    assert differ.code == 1 and "the two passwords differ; nothing changed" in differ.err
    same = cli("admin", "set-password", terminal=True)
    assert same.code == 0 and "admin password updated" in same.out


def test_admin_password_from_stdin_and_its_checks(cli: Cli) -> None:
    assert cli("admin", "set-password").code == 1, "no terminal and no --password-stdin: refuse, do not hang"
    short = cli("admin", "set-password", "--password-stdin", stdin="short\n")
    assert short.code == 1 and "at least 8 characters" in short.err
    assert cli("admin", "set-password", "--password-stdin", stdin="long-enough-password\n").code == 0
    assert cli("set-admin-password", stdin="long-enough-password\n").code == 0, "the old name still works"
    assert "set-admin-password" not in cli("--help").out, "but is not advertised"


def test_bench_passes_its_options_through(cli: Cli) -> None:
    assert "--max-num-seqs" in cli("bench", "--help").out
    result = cli("bench", "--runs", "turbo")
    assert result.code == 2 and "unknown runs: turbo" in result.err


def test_assets_fetch_is_a_no_op_when_current(cli: Cli, monkeypatch: pytest.MonkeyPatch) -> None:
    current = [
        (VENDOR_DIR / a.target).is_file()
        and hashlib.sha256((VENDOR_DIR / a.target).read_bytes()).hexdigest() == a.sha256
        for a in ASSETS
    ]
    if not all(current):
        pytest.skip("the front-end assets are not fetched here (make setup fetches them)")
    monkeypatch.setenv("PATH", "")  # no npm: fetching anything would fail
    monkeypatch.setenv("APPLIANCE_PORT", "not-a-port")  # and the settings are not needed
    result = cli("assets", "fetch")
    assert result.code == 0, result.err
    assert result.out.splitlines() == [f"ok {VENDOR_DIR / a.target}" for a in ASSETS]


def test_readme_configuration_table_is_the_generated_one(cli: Cli) -> None:
    readme = (REPO / "README.md").read_text()
    start, end = "<!-- settings table: appliance settings -->\n", "<!-- end of settings table -->"
    assert start in readme and end in readme, "the README marks where `appliance settings` output goes"
    documented = readme.split(start, 1)[1].split(end, 1)[0]
    assert documented == cli("settings").out, "regenerate the README table with `appliance settings`"


def test_readme_layout_tables_are_the_generated_ones(cli: Cli) -> None:
    readme = (REPO / "README.md").read_text()
    start, end = "<!-- layout: appliance layout -->\n", "<!-- end of layout -->"
    assert start in readme and end in readme, "the README marks where `appliance layout` output goes"
    documented = readme.split(start, 1)[1].split(end, 1)[0]
    assert documented == cli("layout").out, "regenerate the README's layout tables with `appliance layout`"


def test_every_package_and_engine_module_says_what_it_owns() -> None:
    from appliance.cli.layout import ROOMS, summary

    silent = [
        path.relative_to(REPO).as_posix()
        for room in ROOMS
        for path in (REPO / room).rglob("*.py")
        if (path.name == "__init__.py" or room == "engine") and not summary(path)
    ]
    assert silent == [], "a module docstring of one or two lines says what the room owns"
