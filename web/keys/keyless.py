"""Keyless access: the clients that cannot send a key run as one API key the operator names.

GitHub Copilot's bring-your-own-key Ollama provider probes `/api/version`, `/api/tags` and `/api/show` with no
Authorization header, and its chat sends `Bearer ` with an empty key unless one is configured
(microsoft/vscode-copilot-chat, src/extension/byok/vscode-node/ollamaProvider.ts); some editor plugins and Home
Assistant versions take no key at all. With APPLIANCE_KEYLESS_KEY_ID set, a request to the API routes that carries
neither a key nor a session, from an address in APPLIANCE_KEYLESS_NETWORKS, runs as that key: its caps, quota,
concurrency, fair-share seat and history, as if it had sent the key. A request that sends a key is judged by that
key alone (a wrong one is 401, never keyless); the admin's routes and the console never open this way; revoking
the key, or unsetting the setting, closes the door. Off by default.
"""

from __future__ import annotations

from ipaddress import IPv4Network, IPv6Network, ip_address, ip_network

# Loopback and the private ranges (RFC 1918, RFC 4193): the LAN a school's or clinic's box sits on.
PRIVATE_NETWORKS = "127.0.0.0/8,::1/128,10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7"

Network = IPv4Network | IPv6Network


def parse_networks(text: str) -> tuple[Network, ...]:
    """Comma-separated CIDRs (a bare address is its own /32 or /128); ValueError names the bad entry."""
    networks = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(f"{entry!r} is not an address or a network (CIDR, e.g. 10.0.0.0/8)") from None
    return tuple(networks)


class Keyless:
    """A plain class, not a dataclass: Litestar builds a signature model of every handler's dependencies, and msgspec
    cannot type a dataclass field that is a union of two classes (the two network types)."""

    __slots__ = ("key_id", "networks")

    def __init__(self, key_id: int | None = None, networks: tuple[Network, ...] = ()) -> None:
        self.key_id = key_id  # None: every request needs a key or a session
        self.networks = networks

    def __repr__(self) -> str:
        return f"Keyless(key_id={self.key_id!r}, networks={self.networks!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Keyless) and (self.key_id, self.networks) == (other.key_id, other.networks)

    def __hash__(self) -> int:
        return hash((self.key_id, self.networks))

    def key_for(self, host: str | None) -> int | None:
        """The key a request with no credential from `host` runs as, or None (it needs one)."""
        if self.key_id is None or not host:
            return None
        try:
            address = ip_address(host.split("%", 1)[0])  # an IPv6 zone id is not part of the address
        except ValueError:
            return None
        mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:10.0.0.5 from a dual-stack socket
        address = mapped or address
        return self.key_id if any(address in network for network in self.networks) else None


NO_KEYLESS = Keyless()
