"""Network helpers shared by asearch's servers and clients: loopback checks, free ports, per-loop clients."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx


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


class LoopClient:
    """The httpx client of the running event loop, made by `make()` on first use in each loop.

    Pooled connections belong to the loop that opened them, so a new loop (a fresh `asyncio.run`) gets a
    new client; the old one is dropped with its loop.
    """

    def __init__(self, make: Callable[[], httpx.AsyncClient]):
        self._make = make
        self._http: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def get(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._http is None or self._loop is not loop:
            self._http, self._loop = self._make(), loop
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            http, self._http = self._http, None
            try:
                await http.aclose()
            except RuntimeError:  # its loop is gone; the sockets went with it
                pass
