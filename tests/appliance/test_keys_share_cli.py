"""`appliance keys create/set --weight W --class interactive|batch`: a key's fair share from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.appliance.conftest import Cli
from tests.appliance.test_keys_cli import listed


def test_weight_and_class_are_set_at_creation_and_changed_alone(cli: Cli) -> None:
    assert cli("keys", "create", "chat").code == 0
    result = cli("keys", "create", "nightly", "--weight", "0.5", "--class", "batch")
    assert result.code == 0, result.err
    assert "weight 0.5 batch" in result.err
    chat, nightly = listed(cli)
    assert (chat["weight"], chat["priority"]) == (1.0, "interactive"), "a new key's defaults"
    assert (nightly["weight"], nightly["priority"]) == (0.5, "batch")

    changed = cli("keys", "set", "nightly", "--weight", "4")
    assert changed.code == 0, changed.err
    assert "weight 4 batch" in changed.out, "the class is kept when only the weight is given"
    assert cli("keys", "set", "nightly", "--class", "interactive", "--cap", "64").code == 0
    _, nightly = listed(cli)
    assert (nightly["weight"], nightly["priority"], nightly["max_tokens_per_request"]) == (4.0, "interactive", 64)
    assert "4 interactive" in cli("keys", "list").out


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["--weight", "0"], "argument --weight: expected a weight from 0.001 to 1e+06, not '0'"),
        (["--weight", "nan"], "argument --weight: expected a weight from"),
        (["--weight", "heavy"], "argument --weight: expected a number such as 1, 0.5 or 4, not 'heavy'"),
        (["--class", "urgent"], "argument --class: invalid choice: 'urgent'"),
    ],
)
def test_bad_weight_or_class_is_refused_before_the_database_is_touched(
    cli: Cli, data_dir: Path, args: list[str], complaint: str
) -> None:
    result = cli("keys", "create", "x", *args)
    assert result.code == 2 and complaint in result.err
    assert not data_dir.exists()
