"""Whether a host name is this machine: what the servers and clients that allow plain HTTP or
no authentication on loopback only (the codec server, an OIDC issuer's keys) ask."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
