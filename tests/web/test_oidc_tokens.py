"""The ID token checks single sign-on relies on, wired as the flow uses them: tokens minted here with a key of the
test's own, each wrong in one way (audience, expiry, signer, algorithm, nonce), are refused; the right one passes.
The whole flow against a real provider is tests/people/oidc."""

from __future__ import annotations

import time
from typing import Any

import pytest
from authlib.jose import JsonWebKey, jwt

from web.people.oidc.config import WELL_KNOWN, OidcConfig
from web.people.oidc.flow import OidcClient, SignOnFailed

ISSUER = "https://idp.example/realms/school"
METADATA = {"issuer": ISSUER, "id_token_signing_alg_values_supported": ["RS256", "HS256", "none"]}
KEY = JsonWebKey.generate_key("RSA", 2048, is_private=True, options={"kid": "k1"})
OTHER_KEY = JsonWebKey.generate_key("RSA", 2048, is_private=True, options={"kid": "k1"})
JWKS = {"keys": [KEY.as_dict(is_private=False)]}
CLIENT = OidcClient(OidcConfig(ISSUER + WELL_KNOWN, "appliance", "client-secret"))


def token(key: Any = KEY, alg: str = "RS256", **claims: Any) -> dict[str, Any]:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": "appliance", "sub": "u-1", "iat": now, "exp": now + 300, "nonce": "n-1"} | claims
    return {"id_token": jwt.encode({"alg": alg, "kid": "k1"}, body, key).decode()}


def test_a_token_signed_by_the_provider_for_this_client_and_sign_in_passes() -> None:
    assert CLIENT.id_token_claims(token(), JWKS, METADATA, "n-1")["sub"] == "u-1"


@pytest.mark.parametrize(
    ("minted", "reason"),
    [
        (lambda: token(aud="another-client"), "Invalid claim 'aud'"),
        (lambda: token(exp=int(time.time()) - 3600), "The token is expired"),
        (lambda: token(iss="https://evil.example"), "Invalid claim 'iss'"),
        (lambda: token(nonce="n-2"), "Invalid claim 'nonce'"),
        (lambda: token(key=OTHER_KEY), "bad_signature"),
        # Signed with the client secret: a provider offering HS256 is not trusted with it (anyone with the secret).
        (lambda: token(key="client-secret", alg="HS256"), "unsupported_algorithm"),
    ],
)
def test_a_token_wrong_in_one_way_is_refused(minted: Any, reason: str) -> None:
    with pytest.raises(SignOnFailed) as caught:
        CLIENT.id_token_claims(minted(), JWKS, METADATA, "n-1")
    assert str(caught.value) == f"the identity provider's ID token was refused ({reason})"


def test_an_unsigned_token_is_refused() -> None:
    now = int(time.time())
    body = {"iss": ISSUER, "aud": "appliance", "sub": "u-1", "iat": now, "exp": now + 300, "nonce": "n-1"}
    unsigned = jwt.encode({"alg": "none"}, body, None).decode()
    with pytest.raises(SignOnFailed, match="unsupported_algorithm"):
        CLIENT.id_token_claims({"id_token": unsigned}, JWKS, METADATA, "n-1")
