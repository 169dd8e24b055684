"""Single sign-on's parts, built once when the operator configured a provider."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.people.accounts import Accounts
from web.people.oidc.config import OidcConfig
from web.people.oidc.flow import OidcClient
from web.people.oidc.identities import Identities


@dataclass(frozen=True, slots=True)
class SingleSignOn:
    config: OidcConfig
    client: OidcClient
    identities: Identities

    @classmethod
    def of(cls, config: OidcConfig, accounts: Accounts, sessions: async_sessionmaker[AsyncSession]) -> SingleSignOn:
        return cls(config, OidcClient(config), Identities(config, accounts, sessions))
