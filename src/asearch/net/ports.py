"""Loopback checks and free ports, for the servers asearch starts on this machine."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True for localhost and loopback IPs (127.0.0.0/8, ::1): the only hosts servers bind by default."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on `host` a moment ago (another process could still take it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
