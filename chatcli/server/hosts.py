"""Whether a host is this machine: what `serve` binds to (a warning without a key past it) and the
`Host` names a loopback server answers (`guard.HostCheck`). Light: imported at CLI start-up."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """localhost, or a loopback address (127.0.0.0/8, ::1; an IPv6 one with or without brackets)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: could resolve anywhere
