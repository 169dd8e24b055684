"""The admin credential: a scrypt hash in the database, seeded once from the admin_password setting, checked
from HTTP Basic (admin:<password>) or the console's login form, with failed guesses limited per address; /metrics
also accepts a dedicated bearer token. The admin API refuses what a foreign page can make a browser send."""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import secrets
import threading
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.status_codes import HTTP_415_UNSUPPORTED_MEDIA_TYPE
from litestar.types import Guard
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import AdminAuthRequired, InvalidRequest, RateLimited
from web.models import AdminCredential, utcnow
from web.system.login_limiter import LoginLimiter

ADMIN_USER = "admin"
# OWASP's floor for scrypt (Password Storage Cheat Sheet): N=2^17, r=8, p=1. Hashes made at a lower cost (this
# appliance used N=2^14 before) still verify and are re-hashed at the next successful sign-in.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 17, 8, 1
SCRYPT_MAXMEM = 256 << 20  # scrypt needs 128 * N * r bytes (128 MiB here); hashlib refuses more than 32 MiB unless told
# At most two scrypt runs at once, however many guesses arrive together: each holds 128 MiB while it runs.
_SCRYPT_SLOTS = threading.BoundedSemaphore(2)
MIN_PASSWORD_CHARS = 8
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FOREIGN_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site; "same-origin" and "none" are the admin's


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    with _SCRYPT_SLOTS:
        digest = hashlib.scrypt(
            password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32, maxmem=SCRYPT_MAXMEM
        )
    b64 = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${b64(salt).decode()}${b64(digest).decode()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        expected = base64.b64decode(digest)
        with _SCRYPT_SLOTS:
            actual = hashlib.scrypt(
                password.encode(),
                salt=base64.b64decode(salt),
                n=int(n),
                r=int(r),
                p=int(p),
                dklen=len(expected),
                maxmem=SCRYPT_MAXMEM,  # also the ceiling on what a stored hash can make a sign-in cost
            )
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(actual, expected)


def needs_rehash(stored: str) -> bool:
    """Whether a hash was made at less than today's cost."""
    try:
        _, n, r, p, _, _ = stored.split("$")
        return int(n) < SCRYPT_N or int(r) < SCRYPT_R or int(p) < SCRYPT_P
    except ValueError:
        return False


class AdminAuth:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], metrics_token: str | None) -> None:
        self.sessions = sessions
        self._metrics_token = metrics_token
        # scrypt costs 0.3-1 s by design; a console polling every 2 s should not pay it each time. Remember
        # sha256(stored hash + password) of successful checks; a new password changes the stored hash.
        self._verified: set[str] = set()
        self.failures = LoginLimiter()

    async def seed(self, password: str | None) -> bool:
        """Store the first credential if none exists; later starts ignore the setting. Gateways sharing one
        database may start together: the one whose insert loses the race keeps the other's credential."""
        async with self.sessions() as session:
            exists = await session.scalar(select(AdminCredential.id).where(AdminCredential.username == ADMIN_USER))
        if exists is not None or not password:
            return False
        hashed = await self._hashed(password)
        try:
            async with self.sessions.begin() as session:
                session.add(AdminCredential(username=ADMIN_USER, password_hash=hashed, updated_at=utcnow()))
        except IntegrityError:  # uq_admin_credentials_username: another gateway seeded it meanwhile
            return False
        self._verified.clear()
        return True

    async def set_password(self, password: str) -> None:
        hashed = await self._hashed(password)
        async with self.sessions.begin() as session:
            row = await session.scalar(select(AdminCredential).where(AdminCredential.username == ADMIN_USER))
            if row is None:
                session.add(AdminCredential(username=ADMIN_USER, password_hash=hashed, updated_at=utcnow()))
            else:
                row.password_hash, row.updated_at = hashed, utcnow()
        self._verified.clear()

    @staticmethod
    async def _hashed(password: str) -> str:
        if len(password) < MIN_PASSWORD_CHARS:
            raise InvalidRequest(f"the admin password needs at least {MIN_PASSWORD_CHARS} characters")
        return await asyncio.to_thread(hash_password, password)

    async def configured(self) -> bool:
        """Whether an admin credential exists (the console tells "not set up" from "wrong password")."""
        return await self._stored_hash() is not None

    async def verify(self, username: str, password: str) -> bool:
        """The scrypt check of a user name and password (remembered once it succeeded, see __init__)."""
        stored = await self._stored_hash()
        if stored is None:
            return False
        memo = hashlib.sha256(f"{stored}\0{password}".encode()).hexdigest()
        user_ok = hmac.compare_digest(username.encode(), ADMIN_USER.encode())
        if memo in self._verified:
            return user_ok
        if not await asyncio.to_thread(verify_password, password, stored):
            return False
        if user_ok and needs_rehash(stored):
            await self._rehash(stored, password)
            return user_ok
        self._verified.add(memo)
        return user_ok

    async def _rehash(self, old: str, password: str) -> None:
        """Store the password hashed at today's cost in place of `old`, which it just matched; a password set
        meanwhile wins."""
        hashed = await asyncio.to_thread(hash_password, password)
        async with self.sessions.begin() as session:
            row = await session.scalar(select(AdminCredential).where(AdminCredential.username == ADMIN_USER))
            if row is None or not hmac.compare_digest(row.password_hash, old):
                return
            row.password_hash, row.updated_at = hashed, utcnow()
        self._verified.add(hashlib.sha256(f"{hashed}\0{password}".encode()).hexdigest())

    async def check_admin(self, authorization: str | None, address: str) -> None:
        """Raise AdminAuthRequired unless the header carries the admin's Basic credential."""
        if not authorization or not authorization[:6].lower() == "basic ":
            raise AdminAuthRequired("admin credential required (HTTP Basic, user 'admin')")
        try:
            user, _, password = base64.b64decode(authorization[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise AdminAuthRequired("malformed Basic credential") from None
        await self.sign_in(user, password, address)

    async def sign_in(self, username: str, password: str, address: str) -> None:
        """Raise AdminAuthRequired unless these are the admin's user name and password, or RateLimited while this
        address has failed too often (even with the right password: a guess must not learn it was right)."""
        wait = self.failures.retry_after(address)
        if wait:
            raise RateLimited(
                f"too many failed admin sign-ins from your address; try again in {wait} s",
                headers={"Retry-After": str(wait)},
            )
        if not await self.configured():
            raise AdminAuthRequired(
                "no admin credential is configured: set APPLIANCE_ADMIN_PASSWORD before the first start, "
                "or run `appliance set-admin-password`"
            )
        if not await self.verify(username, password):
            self.failures.failed(address)
            raise AdminAuthRequired("incorrect admin credential")
        self.failures.succeeded(address)

    async def _stored_hash(self) -> str | None:
        async with self.sessions() as session:
            return await session.scalar(
                select(AdminCredential.password_hash).where(AdminCredential.username == ADMIN_USER)
            )

    async def check_metrics(self, authorization: str | None, address: str) -> None:
        """/metrics: the metrics bearer token, or the admin credential."""
        if authorization and authorization[:7].lower() == "bearer " and self._metrics_token:
            if hmac.compare_digest(authorization[7:].strip().encode(), self._metrics_token.encode()):
                return
            raise AdminAuthRequired("incorrect metrics token")
        await self.check_admin(authorization, address)


def client_address(connection: ASGIConnection[Any, Any, Any, Any]) -> str:
    return connection.client.host if connection.client else "unknown"


def refuse_cross_site(connection: ASGIConnection[Any, Any, Any, Any]) -> None:
    """A browser that once answered the Basic prompt sends the credential with any request to the appliance, also
    one a foreign page makes it send (a form post, a no-cors fetch: no preflight). So a state-changing request is
    refused when the browser says it comes from another site, and a body must be JSON, which no form can send.
    curl and scripts send neither Origin nor Sec-Fetch-Site."""
    if connection.scope.get("method", "GET") in SAFE_METHODS:
        return
    headers = connection.headers
    if headers.get("sec-fetch-site", "").lower() in FOREIGN_SITES:
        raise PermissionDeniedException("cross-site requests to the admin API are refused")
    origin = headers.get("origin")
    if origin is not None and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
        raise PermissionDeniedException(f"requests from another origin than {headers.get('host', '')!r} are refused")
    content_type = headers.get("content-type")
    carries_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    is_json = content_type is not None and content_type.split(";")[0].strip().lower() == "application/json"
    if (content_type is not None or carries_body) and not is_json:
        raise HTTPException(
            "the admin API takes request bodies as application/json only", status_code=HTTP_415_UNSUPPORTED_MEDIA_TYPE
        )


def admin_guard(admin: AdminAuth) -> Guard:
    """The admin API's guard: no cross-site requests, then the admin's credential."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        refuse_cross_site(connection)
        await admin.check_admin(connection.headers.get("authorization"), client_address(connection))

    return guard


def metrics_guard(admin: AdminAuth) -> Guard:
    """/metrics: the admin's credential or the metrics token."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], _: BaseRouteHandler) -> None:
        await admin.check_metrics(connection.headers.get("authorization"), client_address(connection))

    return guard
