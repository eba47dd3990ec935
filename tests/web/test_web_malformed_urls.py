"""Malformed urls from a hostile page or the agent: each is a refused fetch that names the url and why,
never an exception out of `run_tool`, and never retried (a url that cannot be valid will not become valid).

A raw-socket server on 127.0.0.1 answers every request with a 302 whose Location header bytes the test
chooses, and counts requests, so a retry would show as a second request.
"""

from __future__ import annotations

import asyncio
import socket
import threading

import httpx
import pytest

from asearch.errors import ToolError
from asearch.tools import AccessTool, run_tool
from asearch.web import FetchConfig, UrlPolicy, WebPageBackend
from asearch.web.resilience import Resilience, ResilienceConfig

PAGE = b"<html><head><title>Landing</title></head><body><p>The landing page text.</p></body></html>"


class RedirectServer:
    """Answers `/landing` with a page and anything else with `302 Location: <location>`, byte for byte."""

    def __init__(self, location: bytes):
        self.location = location
        self.paths: list[str] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RedirectServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
        self._sock.close()
        self._thread.join(timeout=5)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the socket was closed: the test is over
                return
            with conn:
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            chunk = conn.recv(65536)
            if not chunk:
                return
            request += chunk
        path = request.split(b" ", 2)[1].decode("latin-1")
        self.paths.append(path)
        if path == "/landing":
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n" % len(PAGE)
            conn.sendall(head + b"Connection: close\r\n\r\n" + PAGE)
            return
        head = b"HTTP/1.1 302 Found\r\nLocation: " + self.location + b"\r\n"
        conn.sendall(head + b"Content-Length: 0\r\nConnection: close\r\n\r\n")


def access_tool(port: int) -> tuple[AccessTool, WebPageBackend]:
    """The web `access` tool with retries on (3 attempts, no wait) and only this test server trusted."""
    config = FetchConfig(
        guard=UrlPolicy(allow_hosts=[f"127.0.0.1:{port}"]),
        resilience={"retries": 2, "backoff_s": 0.0, "max_backoff_s": 0.0, "timeout_s": 5.0},
    )
    backend = WebPageBackend(config)
    return AccessTool(backend), backend


def access(tool: AccessTool, backend: WebPageBackend, url: str):
    async def go():
        try:
            return await run_tool(tool, url)
        finally:
            await backend.aclose()

    return asyncio.run(go())


@pytest.mark.parametrize(
    ("location", "reason"),
    [
        (b"http:\\\\evil\\x", "contains a backslash"),
        (b"http://a:99999/", "port 99999 is out of range"),
        (b"http://a:99999999999999999999/", "is out of range"),
        (b"http://[::1/", "not a valid url (Invalid port"),
        (b"//[::1", "not a valid url (Invalid port"),
        (b"http://[zz::1]/", "Invalid IPv6 address"),
        (b"http://xn--/", "not a valid internationalised name"),
        (b"http://a..b/", "is not a valid host name"),
        (b"http://%zz/", "is not a valid host name"),
        (b"http://exa mple.com/", "contains a space"),
    ],
)
def test_a_malformed_redirect_is_refused_once_with_its_reason(location, reason):
    with RedirectServer(location) as server:
        tool, backend = access_tool(server.port)
        obs = access(tool, backend, f"{server.base_url}/start")
    assert obs.error and obs.metadata["error"] == "tool"  # a refusal, not a remote failure
    assert obs.text.startswith(f"access failed: refused to fetch {location.decode('latin-1')}: ")
    assert reason in obs.text and f"(a redirect from {server.base_url}/start)" in obs.text
    assert server.paths == ["/start"]  # exactly one request: refused, never retried
    assert backend.service.retries == 0


def test_control_a_well_formed_redirect_is_followed():
    """The server and the tool work: a relative Location reaches the landing page."""
    with RedirectServer(b"/landing") as server:
        tool, backend = access_tool(server.port)
        obs = access(tool, backend, f"{server.base_url}/start")
    assert obs.ok and "The landing page text." in obs.text
    assert server.paths == ["/start", "/landing"]


def test_a_redirect_to_loopback_stays_refused():
    """The guard still vets every hop: only the first hop's exact host:port is trusted."""
    with RedirectServer(b"http://localhost:1/secret") as server:
        tool, backend = access_tool(server.port)
        obs = access(tool, backend, f"{server.base_url}/start")
    assert obs.metadata["error"] == "tool" and "names this machine" in obs.text
    assert server.paths == ["/start"]


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http:\\\\127.0.0.1:{port}\\x", "contains a backslash"),
        ("http://127.0.0.1:99999/", "port 99999 is out of range"),
        ("http://[::1/", "not a valid url (Invalid port"),
        ("http://xn--/", "not a valid internationalised name"),
        ("http://%zz/", "is not a valid host name"),
        ("http://127.0.0.1:{port}\x00/", "contains the control character '\\x00'"),
    ],
)
def test_a_malformed_first_url_is_refused_with_its_reason(url, reason):
    with RedirectServer(b"/landing") as server:
        url = url.format(port=server.port)
        tool, backend = access_tool(server.port)
        obs = access(tool, backend, url)
    assert obs.error and obs.metadata["error"] == "tool"
    assert obs.text.startswith(f"access failed: refused to fetch {url}: ") and reason in obs.text
    assert server.paths == []  # refused before any request
    assert backend.runtime.stats()["events"]["direct_blocked"] == 1


def test_an_invalid_url_anywhere_under_resilience_is_a_refusal_never_retried():
    """Any other path (a reader's request url) that hands httpx a url it cannot parse is refused once."""
    service = Resilience("reader", ResilienceConfig(retries=2, backoff_s=0.0, max_backoff_s=0.0))

    async def request():
        async with httpx.AsyncClient() as client:
            return await client.get("http://[::1/")

    with pytest.raises(ToolError, match=r"reader: refused a url that is not valid \(Invalid port"):
        asyncio.run(service.run(request))
    assert (service.attempts, service.retries, service.refused) == (1, 0, 1)
