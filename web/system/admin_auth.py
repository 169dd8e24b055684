"""The admin's credentials: the admin accounts (web/people), the first seeded once from the admin_password
setting, checked from HTTP Basic (<name>:<password>) on the admin API, with failed guesses limited per address and
per name; /metrics also accepts a dedicated bearer token. The admin API refuses what a foreign page can make a
browser send."""

from __future__ import annotations

import base64
import binascii
import hmac
from typing import Any
from urllib.parse import urlsplit

from litestar.connection import ASGIConnection
from litestar.exceptions import HTTPException, PermissionDeniedException
from litestar.handlers import BaseRouteHandler
from litestar.status_codes import HTTP_415_UNSUPPORTED_MEDIA_TYPE
from litestar.types import Guard
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from web.errors import AdminAuthRequired, InvalidRequest, NameTaken, RateLimited, SignInFailed
from web.models import User
from web.people.accounts import Accounts, Person, hashed
from web.people.passwords import hash_password as hash_password
from web.people.passwords import verify_password as verify_password
from web.people.signin import SignIn

ADMIN_USER = "admin"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FOREIGN_SITES = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site; "same-origin" and "none" are the admin's


class AdminAuth:
    def __init__(self, accounts: Accounts, signin: SignIn, metrics_token: str | None) -> None:
        self.accounts = accounts
        self.signin = signin
        self._metrics_token = metrics_token

    @classmethod
    def over(cls, sessions: async_sessionmaker[AsyncSession], metrics_token: str | None = None) -> AdminAuth:
        """Over its own accounts and sign-in limits (the CLI, tests); the app shares them with the chat page."""
        return cls(Accounts(sessions), SignIn(sessions), metrics_token)

    async def seed(self, password: str | None) -> bool:
        """Create the first admin account, named admin, if there is no admin yet; later starts ignore the setting.
        Gateways sharing one database may start together: the one whose insert loses the race keeps the other's."""
        if not password or await self.configured():
            return False
        try:
            await self.accounts.insert(ADMIN_USER, await self._hashed(password), "admin", None)
        except NameTaken:  # uq_users_username: another gateway seeded it meanwhile
            return False
        return True

    async def set_password(self, password: str) -> None:
        """`appliance set-admin-password`: the admin account's password, the account made if it is missing."""
        row = await self.accounts.by_name(ADMIN_USER)
        if row is None:
            await self.accounts.insert(ADMIN_USER, await self._hashed(password), "admin", None)
            return
        await self.accounts.set_password(row.id, password)
        if row.role != "admin" or row.suspended:
            await self.accounts.set_role(row.id, "admin")
            await self.accounts.set_suspended(row.id, False)

    @staticmethod
    async def _hashed(password: str) -> str:
        try:
            return await hashed(password)
        except InvalidRequest as exc:
            raise InvalidRequest(exc.message.replace("the password", "the admin password")) from None

    async def configured(self) -> bool:
        """Whether an admin account exists (the console tells "not set up" from "wrong password")."""
        async with self.accounts.sessions() as session:
            return await session.scalar(select(User.id).where(User.role == "admin").limit(1)) is not None

    async def check_admin(self, authorization: str | None, address: str) -> None:
        """Raise AdminAuthRequired unless the header carries an admin's Basic credential."""
        if not authorization or not authorization[:6].lower() == "basic ":
            raise AdminAuthRequired("admin credential required (HTTP Basic, user 'admin')")
        try:
            user, _, password = base64.b64decode(authorization[6:].strip(), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            raise AdminAuthRequired("malformed Basic credential") from None
        await self.sign_in(user, password, address)

    async def sign_in(self, username: str, password: str, address: str) -> Person:
        """Raise AdminAuthRequired unless these are an admin's name and password, or RateLimited while this
        address or name has failed too often."""
        if not await self.configured():
            raise AdminAuthRequired(
                "no admin credential is configured: set APPLIANCE_ADMIN_PASSWORD before the first start, "
                "or run `appliance set-admin-password`"
            )
        try:
            person = await self.signin.authenticate(username, password, address)
        except SignInFailed:
            raise AdminAuthRequired("incorrect admin credential") from None
        except RateLimited as exc:
            raise RateLimited(
                f"too many failed admin sign-ins; try again in {exc.headers['Retry-After']} s", headers=exc.headers
            ) from None
        if person.role != "admin" or person.suspended:
            raise AdminAuthRequired("incorrect admin credential")  # a person, but no admin: as a wrong password
        return person

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
