"""The authorization code flow with PKCE, state and nonce against the provider its discovery document describes;
authlib does the protocol and the ID token's checks (signature by the provider's JWKS, iss, aud, exp, nonce)."""

from __future__ import annotations

import hmac
import logging
import secrets
import time
from dataclasses import dataclass
from typing import Any

import httpx
from authlib.integrations.httpx_client import AsyncOAuth2Client
from authlib.jose import JsonWebKey, JsonWebToken
from authlib.jose.errors import JoseError
from authlib.oauth2.rfc6749.errors import OAuth2Error
from authlib.oidc.core import CodeIDToken

from web.people.oidc.config import OidcConfig

log = logging.getLogger("web.people.oidc")
TIMEOUT_S = 10.0
METADATA_TTL_S = 300.0  # a provider's endpoints and keys move rarely; a rotated key is found at the next fetch
# Only signatures made with the provider's private key: a symmetric or "none" algorithm would let anyone who knows
# the client secret (or nothing) mint tokens.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
MAX_PART = 128


class SignOnFailed(Exception):
    """Single sign-on did not prove who this is; the message is for the person at the sign-in page."""


@dataclass(frozen=True, slots=True)
class Flow:
    """One sign-in's secrets, which the browser's flow cookie carries to the provider and back: `state` ties the
    answer to this browser, `nonce` the ID token to this sign-in, `verifier` (PKCE) the code to this client."""

    state: str
    nonce: str
    verifier: str

    @classmethod
    def new(cls) -> Flow:
        return cls(secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48))

    def cookie_value(self) -> str:
        return f"{self.state}.{self.nonce}.{self.verifier}"  # url-safe base64 never holds a dot

    @classmethod
    def of_cookie(cls, value: str | None) -> Flow | None:
        parts = (value or "").split(".")
        if len(parts) != 3 or not all(0 < len(part) <= MAX_PART for part in parts):
            return None
        return cls(*parts)

    def state_matches(self, presented: str | None) -> bool:
        return bool(presented) and hmac.compare_digest(self.state.encode(), (presented or "").encode()[:MAX_PART])


class OidcClient:
    def __init__(self, config: OidcConfig) -> None:
        self.config = config
        self._metadata: tuple[float, dict[str, Any]] | None = None

    def _oauth(self, redirect_uri: str) -> AsyncOAuth2Client:
        """A client per sign-in: authlib's keeps the last token on itself, which sign-ins must not share."""
        return AsyncOAuth2Client(
            self.config.client_id,
            self.config.client_secret,
            scope=self.config.scopes,
            redirect_uri=redirect_uri,
            code_challenge_method="S256",
            timeout=TIMEOUT_S,
        )

    async def authorization_url(self, flow: Flow, redirect_uri: str) -> str:
        endpoint = (await self.metadata())["authorization_endpoint"]
        async with self._oauth(redirect_uri) as oauth:
            url, _ = oauth.create_authorization_url(
                endpoint, state=flow.state, code_verifier=flow.verifier, nonce=flow.nonce
            )
        return str(url)

    async def claims(self, flow: Flow, redirect_uri: str, code: str, iss: str | None) -> dict[str, Any]:
        """The ID token's claims once its code is exchanged and every check passed; else SignOnFailed."""
        metadata = await self.metadata()
        if iss is not None and iss != metadata["issuer"]:  # RFC 9207: the answer came from another provider
            raise SignOnFailed("the answer came from another identity provider (its issuer differs)")
        async with self._oauth(redirect_uri) as oauth:
            try:
                token = await oauth.fetch_token(
                    metadata["token_endpoint"], grant_type="authorization_code", code=code, code_verifier=flow.verifier
                )
                jwks = (await oauth.get(metadata["jwks_uri"])).raise_for_status().json()
            except (OAuth2Error, httpx.HTTPError, ValueError) as exc:
                log.warning("single sign-on: the code exchange failed: %s", exc)
                raise SignOnFailed("the identity provider did not confirm the sign-in") from None
        if "id_token" not in token:
            raise SignOnFailed("the identity provider sent no ID token")
        return self.id_token_claims(token, jwks, metadata, flow.nonce)

    def id_token_claims(self, token: dict[str, Any], jwks: Any, metadata: dict[str, Any], nonce: str) -> dict[str, Any]:
        """The claims of the token response's ID token, if the provider's keys signed it for this client and sign-in."""
        offered = metadata.get("id_token_signing_alg_values_supported") or ["RS256"]
        jwt = JsonWebToken([alg for alg in offered if alg in ASYMMETRIC])
        options = {
            "iss": {"essential": True, "value": self.config.issuer},
            "aud": {"essential": True, "value": self.config.client_id},
            "exp": {"essential": True},
            "sub": {"essential": True},
        }
        params = {"nonce": nonce, "client_id": self.config.client_id, "access_token": token.get("access_token")}
        try:
            claims = jwt.decode(
                token["id_token"],
                JsonWebKey.import_key_set(jwks),
                claims_cls=CodeIDToken,
                claims_options=options,
                claims_params=params,
            )
            claims.validate(leeway=60)
        except (JoseError, ValueError) as exc:
            log.warning("single sign-on: an ID token was refused: %s", exc)
            raise SignOnFailed(f"the identity provider's ID token was refused ({_reason(exc)})") from None
        return dict(claims)

    async def metadata(self) -> dict[str, Any]:
        """The discovery document, fetched at most every few minutes; its issuer must be the one its URL names."""
        now = time.monotonic()
        if self._metadata is not None and now - self._metadata[0] < METADATA_TTL_S:
            return self._metadata[1]
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as http:
                document = (await http.get(self.config.discovery_url)).raise_for_status().json()
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("single sign-on: the discovery document could not be read: %s", exc)
            raise SignOnFailed("the identity provider cannot be reached; try again later") from None
        needed = ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri")
        if not isinstance(document, dict) or not all(isinstance(document.get(key), str) for key in needed):
            raise SignOnFailed("the identity provider's discovery document is incomplete")
        if document["issuer"] != self.config.issuer:
            log.warning("single sign-on: the discovery document names issuer %r, not %r", document["issuer"],
                        self.config.issuer)  # fmt: skip
            raise SignOnFailed("the identity provider's discovery document names another issuer")
        self._metadata = (now, document)
        return document


def _reason(exc: Exception) -> str:
    """What a JOSE error says, e.g. `Invalid claim "iss"` (it never holds the token)."""
    text = getattr(exc, "description", None) or getattr(exc, "error", None)
    return str(text) if text else type(exc).__name__
