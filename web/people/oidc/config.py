"""What single sign-on needs to know, and the pure rules it applies: which plan a person's groups give (the first
mapped group, in the operator's order), and whether they make an admin."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


class OidcConfigError(ValueError):
    """A single sign-on setting that cannot be used; the message says which and why."""


@dataclass(frozen=True, slots=True)
class OidcConfig:
    discovery_url: str  # https://idp.example/realms/school/.well-known/openid-configuration
    client_id: str
    client_secret: str = field(repr=False)
    name: str = "single sign-on"  # the button says "Sign in with <name>"
    scopes: str = "openid profile email"
    groups_claim: str = "groups"
    # (group, plan name) in the operator's order: a person in several mapped groups gets the first one's plan.
    group_plans: tuple[tuple[str, str], ...] = ()
    unmapped_plan: str | None = None  # the plan of a person in no mapped group; None: they may not sign in
    admin_groups: frozenset[str] = frozenset()  # members are admins; empty: sign-in never changes anyone's role
    redirect_url: str | None = None  # None: this server's /auth/oidc/callback as the browser reached it

    @property
    def issuer(self) -> str:
        """The issuer the discovery URL names (OpenID Connect Discovery 1.0, section 4): the document and every
        ID token must say exactly this."""
        return self.discovery_url.removesuffix(WELL_KNOWN)

    def plan_of(self, groups: Iterable[str]) -> str | None:
        """The plan name a person's groups give, or the unmapped plan (None: no plan, refuse them)."""
        held = set(groups)
        return next((plan for group, plan in self.group_plans if group in held), self.unmapped_plan)

    def role_of(self, groups: Iterable[str], current: str) -> str:
        """Members of an admin group are admins, others users; with no admin groups configured, roles stay the
        console's to set."""
        if not self.admin_groups:
            return current
        return "admin" if self.admin_groups & set(groups) else "user"


WELL_KNOWN = "/.well-known/openid-configuration"


def parse_group_plans(text: str) -> tuple[tuple[str, str], ...]:
    """`staff=teachers,students=pupils` -> (("staff", "teachers"), ("students", "pupils")), order kept."""
    pairs: list[tuple[str, str]] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        group, sep, plan = (s.strip() for s in item.partition("="))
        if not sep or not group or not plan:
            raise OidcConfigError(f"expected group=plan pairs separated by commas, not {item!r}")
        if group in dict(pairs):
            raise OidcConfigError(f"the group {group!r} is mapped twice")
        pairs.append((group, plan))
    return tuple(pairs)


def check_discovery_url(url: str) -> None:
    if not url.startswith(("https://", "http://")) or not url.endswith(WELL_KNOWN):
        raise OidcConfigError(f"the discovery URL must be http(s)://<issuer>{WELL_KNOWN}, not {url!r}")
