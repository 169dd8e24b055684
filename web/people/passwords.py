"""Password hashing for every account (the admin's too): scrypt at OWASP's floor, at most two runs at once, old
hashes re-hashed at the next sign-in; and a hash of no one's password, so that an unknown name costs a guess as
much time as a wrong password does."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import secrets
import threading

# OWASP's floor for scrypt (Password Storage Cheat Sheet): N=2^17, r=8, p=1. Hashes made at a lower cost (this
# appliance used N=2^14 before) still verify and are re-hashed at the next successful sign-in.
SCRYPT_N, SCRYPT_R, SCRYPT_P = 1 << 17, 8, 1
SCRYPT_MAXMEM = 256 << 20  # scrypt needs 128 * N * r bytes (128 MiB here); hashlib refuses more than 32 MiB unless told
# At most two scrypt runs at once, however many guesses arrive together: each holds 128 MiB while it runs.
_SCRYPT_SLOTS = threading.BoundedSemaphore(2)
MIN_PASSWORD_CHARS = 8
MAX_PASSWORD_CHARS = 1024  # scrypt takes any length; a megabyte "password" only costs the gateway


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    with _SCRYPT_SLOTS:
        digest = hashlib.scrypt(
            password.encode("utf-8", "surrogatepass"),
            salt=salt,
            n=SCRYPT_N,
            r=SCRYPT_R,
            p=SCRYPT_P,
            dklen=32,
            maxmem=SCRYPT_MAXMEM,
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
                password.encode("utf-8", "surrogatepass"),
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


@functools.cache
def nobodys_hash() -> str:
    """Verified against when the user name is unknown: the same scrypt work as a wrong password."""
    return hash_password(secrets.token_urlsafe(32))


def check_new_password(password: str) -> str | None:
    """Why this password cannot be set, or None."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"the password needs at least {MIN_PASSWORD_CHARS} characters"
    if len(password) > MAX_PASSWORD_CHARS:
        return f"the password may have at most {MAX_PASSWORD_CHARS} characters"
    return None
