"""Who a request comes from: its client's address, read through trusted proxies only.

Behind a TLS proxy every connection comes from the proxy's address, so throttles keyed on
`REMOTE_ADDR` would put every client in one bucket (fifty wrong keys from anyone lock out all).
`X-Forwarded-For` is believed only when the connection comes from an address in
INFERENCE_TRUSTED_PROXIES, as django-axes (`AXES_IPWARE_PROXY_TRUSTED_IPS`) and Django REST
framework (`NUM_PROXIES`) do: the header is read from the right, skipping trusted proxies, and the
first address that is not one is the client (anything left of it is the client's own claim and
could be forged). An address is counted by its IPv4 address or its IPv6 /64, the block one
subscriber holds.
"""
from __future__ import annotations

import functools
import ipaddress

from django.conf import settings


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_networks(text: str) -> tuple[Network, ...]:
    """`10.0.0.0/8, 127.0.0.1` as networks (a bare address is a network of one); ValueError names a bad one."""
    networks = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError as exc:
            raise ValueError(f"not an address or network: {item!r}") from exc
    return tuple(networks)


@functools.lru_cache(maxsize=8)
def _trusted(text: str) -> tuple[Network, ...]:
    return parse_networks(text)


def trusted_proxies() -> tuple[Network, ...]:
    return _trusted(settings.INFERENCE.teams.trusted_proxies)


def _parsed(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        parsed = ipaddress.ip_address(address.strip().strip("[]"))
    except ValueError:
        return None
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped
    return parsed


def in_networks(address: str, networks: tuple[Network, ...]) -> bool:
    parsed = _parsed(address)
    return parsed is not None and any(parsed in network for network in networks)


def client_address(remote_addr: str, forwarded_for: str = "", networks: tuple[Network, ...] | None = None) -> str:
    """The client's address: `remote_addr`, unless it is a trusted proxy, then the rightmost address of
    `forwarded_for` (X-Forwarded-For) that is not a trusted proxy."""
    networks = trusted_proxies() if networks is None else networks
    if not networks or not forwarded_for or not in_networks(remote_addr, networks):
        return remote_addr
    hops = [hop.strip() for hop in forwarded_for.split(",") if hop.strip()]
    for hop in reversed(hops):
        if not in_networks(hop, networks):
            return hop if _parsed(hop) is not None else remote_addr  # garbage in the header: the proxy's address
    return hops[0] if hops else remote_addr  # every hop a proxy of ours: the first is as far as we can see


def request_client_address(request) -> str:
    """A Django request's client address (REMOTE_ADDR through the trusted proxies)."""
    meta = request.META
    return client_address(meta.get("REMOTE_ADDR") or "", meta.get("HTTP_X_FORWARDED_FOR") or "")


def address_bucket(address: str) -> str:
    """What throttles count by: the IPv4 address, or the IPv6 /64 (one subscriber's block)."""
    parsed = _parsed(address)
    if parsed is None:
        return address or "?"
    if isinstance(parsed, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


def axes_client_ip(request) -> str:
    """django-axes' AXES_CLIENT_IP_CALLABLE: login lockouts count the same client address."""
    return request_client_address(request)
