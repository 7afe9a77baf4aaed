"""Which network destinations a download may connect to.

The policy is applied to the *resolved* address, the one the socket then
connects to (``fetch`` never resolves a name twice), on the first request and
on every redirect: a name that resolves to a private address, or a public URL
that redirects to ``http://169.254.169.254/``, is refused like a literal one.

Allowed by default: globally routable unicast addresses only. Refused:
loopback, link-local (cloud metadata endpoints live there), private
(RFC 1918, unique-local IPv6), shared address space (100.64/10), multicast,
reserved, unspecified, and IPv6 forms that embed a refused IPv4 address
(IPv4-mapped, 6to4, Teredo). ``allow_loopback`` adds 127.0.0.0/8 and ::1 only,
for tests and benchmarks against a local server.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Callable, List, Optional, Sequence, Tuple

#: ``resolve(host, port) -> [(family, ip text), ...]``; injectable for tests.
Resolver = Callable[[str, int], Sequence[Tuple[int, str]]]


def system_resolver(host: str, port: int) -> List[Tuple[int, str]]:
    """The host's addresses from the system resolver, in its order, without duplicates."""
    found = []
    for family, _, _, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        if family in (socket.AF_INET, socket.AF_INET6) and (family, sockaddr[0]) not in found:
            found.append((family, sockaddr[0]))
    return found


def _embedded_ipv4(address: ipaddress.IPv6Address) -> Optional[ipaddress.IPv4Address]:
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def refusal(ip_text: str, allow_loopback: bool = False) -> Optional[str]:
    """Why ``ip_text`` may not be fetched from (a short word), or None if it may."""
    try:
        address = ipaddress.ip_address(ip_text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return "not_an_address"
    if isinstance(address, ipaddress.IPv6Address):
        inner = _embedded_ipv4(address)
        if inner is not None:
            return refusal(str(inner), allow_loopback)
    if address.is_loopback:
        return None if allow_loopback else "loopback"
    if address.is_unspecified:
        return "unspecified"
    if address.is_link_local:
        return "link_local"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    if address.is_private or not address.is_global:
        return "private"
    return None


def is_allowed(ip_text: str, allow_loopback: bool = False) -> bool:
    return refusal(ip_text, allow_loopback) is None
