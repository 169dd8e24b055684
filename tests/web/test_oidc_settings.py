"""Single sign-on's settings: read into one configuration, refused with a message that names the variable, the
client secret never shown; and the rules it applies to groups and names."""

from __future__ import annotations

import pytest

from appliance.settings import SettingsError, load_settings
from appliance.settings.sign_in import oidc_config
from web.people.oidc.config import OidcConfig
from web.people.oidc.identities import candidates, groups_of, wanted_name

DISCOVERY = "https://idp.example/realms/school/.well-known/openid-configuration"
BASE = {
    "APPLIANCE_OIDC_DISCOVERY_URL": DISCOVERY,
    "APPLIANCE_OIDC_CLIENT_ID": "appliance",
    "APPLIANCE_OIDC_CLIENT_SECRET": "s3cret-value",
}


def test_the_settings_make_one_configuration_and_hide_the_secret() -> None:
    settings = load_settings(
        BASE | {"APPLIANCE_OIDC_GROUP_PLANS": " staff=teachers , students=pupils", "APPLIANCE_OIDC_ADMIN_GROUPS": "it,"}
    )
    config = oidc_config(settings)
    assert config is not None
    assert config.issuer == "https://idp.example/realms/school"
    assert config.group_plans == (("staff", "teachers"), ("students", "pupils"))
    assert config.admin_groups == frozenset({"it"})
    assert "s3cret-value" not in repr(settings) and "s3cret-value" not in repr(config)
    assert oidc_config(load_settings({})) is None


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"APPLIANCE_OIDC_GROUP_PLANS": "staff"}, "group=plan"),
        ({"APPLIANCE_OIDC_GROUP_PLANS": "staff=a,staff=b"}, "mapped twice"),
        ({"APPLIANCE_OIDC_DISCOVERY_URL": "https://idp.example/realms/school"}, "/.well-known/openid-configuration"),
        ({"APPLIANCE_OIDC_CLIENT_SECRET": ""}, "APPLIANCE_OIDC_CLIENT_SECRET"),
        ({"APPLIANCE_OIDC_SCOPES": "profile email"}, "openid"),
    ],
)
def test_a_bad_setting_is_refused_by_name(extra: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(BASE | extra)
    assert "s3cret-value" not in str(caught.value)


def test_a_client_id_without_a_provider_is_refused() -> None:
    with pytest.raises(SettingsError, match="APPLIANCE_OIDC_DISCOVERY_URL"):
        load_settings({"APPLIANCE_OIDC_CLIENT_ID": "appliance"})


def test_the_first_mapped_group_in_the_operators_order_gives_the_plan() -> None:
    config = OidcConfig(DISCOVERY, "id", "secret", group_plans=(("staff", "teachers"), ("students", "pupils")))
    assert config.plan_of(["students", "staff"]) == "teachers"
    assert config.plan_of(["students"]) == "pupils"
    assert config.plan_of(["visitors"]) is None
    assert OidcConfig(DISCOVERY, "id", "secret", unmapped_plan="guests").plan_of([]) == "guests"
    assert config.role_of(["it"], "admin") == "admin"  # no admin groups: the role stays the console's
    admins = OidcConfig(DISCOVERY, "id", "secret", admin_groups=frozenset({"it"}))
    assert (admins.role_of(["it"], "user"), admins.role_of(["staff"], "admin")) == ("admin", "user")


def test_names_and_groups_from_hostile_claims() -> None:
    assert wanted_name({"preferred_username": "  Zoë O'Brien "}) == "zo-o-brien"
    assert wanted_name({"preferred_username": "", "email": "Ann@School.example"}) == "ann@school.example"
    assert wanted_name({"preferred_username": ["not", "a", "name"]}) == "user"
    assert len(wanted_name({"preferred_username": "x" * 500})) == 56
    assert list(candidates("bob"))[:3] == ["bob", "bob-2", "bob-3"]
    assert groups_of({"groups": "staff"}, "groups") == ["staff"]
    assert groups_of({"groups": ["staff", 7, None]}, "groups") == ["staff"]
    assert groups_of({"groups": {"staff": True}}, "groups") == []
