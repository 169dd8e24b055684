"""Sign-in settings: the first admin password, self sign-up, and single sign-on through an OpenID Connect
provider (its groups mapped to plans and the admin role)."""

from __future__ import annotations

from dataclasses import dataclass

from appliance.settings.field import PREFIX, SettingsError, setting
from web.people.oidc.config import OidcConfig, OidcConfigError, check_discovery_url, parse_group_plans


@dataclass(frozen=True)
class SignInSettings:
    admin_password: str | None = setting(
        None, "Admin password; used only at first start to seed the stored (hashed) credential.", secret=True
    )
    self_signup: bool = setting(
        False, "People may sign up at /signup; their accounts wait, pending, until the admin approves them."
    )
    oidc_discovery_url: str | None = setting(
        None,
        "Single sign-on: the OpenID Connect provider's discovery URL, <issuer>/.well-known/openid-configuration "
        "(Keycloak: https://host/realms/<realm>/...). Unset: password sign-in only.",
    )
    oidc_client_id: str | None = setting(None, "Single sign-on: this appliance's client id at the provider.")
    oidc_client_secret: str | None = setting(
        None, "Single sign-on: the client's secret (a confidential client).", secret=True
    )
    oidc_name: str = setting("single sign-on", 'Single sign-on: the provider\'s name on the "Sign in with" button.')
    oidc_scopes: str = setting("openid profile email", "Single sign-on: the scopes asked for (openid among them).")
    oidc_groups_claim: str = setting("groups", "Single sign-on: the ID token claim that lists a person's groups.")
    oidc_group_plans: str = setting(
        "",
        "Single sign-on: group=plan pairs, comma-separated (staff=teachers,students=pupils); a person in several "
        "mapped groups gets the first listed one's plan. Recomputed at every sign-in.",
        default_doc="empty: no group gives a plan",
    )
    oidc_unmapped_plan: str | None = setting(
        None, "Single sign-on: the plan of a person in no mapped group. Unset: such a person may not sign in."
    )
    oidc_admin_groups: str = setting(
        "",
        "Single sign-on: comma-separated groups whose members are admins (others are made users at each "
        "sign-in). Empty: sign-in never changes a role; the console sets them.",
        default_doc="empty: roles are the console's",
    )
    oidc_redirect_url: str | None = setting(
        None,
        "Single sign-on: the redirect URI registered at the provider, where a proxy changes the address.",
        default_doc="this server's /auth/oidc/callback as the browser reaches it",
    )


def oidc_config(s: SignInSettings) -> OidcConfig | None:
    """Single sign-on's configuration, or None where no discovery URL is set."""
    if s.oidc_discovery_url is None:
        return None
    if not s.oidc_client_id or not s.oidc_client_secret:
        raise SettingsError(f"{PREFIX}OIDC_DISCOVERY_URL needs {PREFIX}OIDC_CLIENT_ID and {PREFIX}OIDC_CLIENT_SECRET")
    return OidcConfig(
        discovery_url=s.oidc_discovery_url,
        client_id=s.oidc_client_id,
        client_secret=s.oidc_client_secret,
        name=s.oidc_name,
        scopes=s.oidc_scopes,
        groups_claim=s.oidc_groups_claim,
        group_plans=parse_group_plans(s.oidc_group_plans),
        unmapped_plan=s.oidc_unmapped_plan,
        admin_groups=frozenset(filter(None, (g.strip() for g in s.oidc_admin_groups.split(",")))),
        redirect_url=s.oidc_redirect_url,
    )


def check_sign_in(s: SignInSettings) -> None:
    if s.oidc_discovery_url is None:
        if s.oidc_client_id or s.oidc_client_secret:
            raise SettingsError(f"{PREFIX}OIDC_CLIENT_ID and _SECRET need {PREFIX}OIDC_DISCOVERY_URL")
        return
    try:
        check_discovery_url(s.oidc_discovery_url)
        parse_group_plans(s.oidc_group_plans)
    except OidcConfigError as exc:
        raise SettingsError(f"{PREFIX}OIDC_*: {exc}") from None
    if "openid" not in s.oidc_scopes.split():
        raise SettingsError(f"{PREFIX}OIDC_SCOPES must include openid")
    oidc_config(s)
