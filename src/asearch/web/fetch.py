"""Direct page fetches behind the SSRF guard: every hop of a redirect chain is checked, bodies are read
up to a byte limit, and only readable media types (HTML, text, PDF) are accepted."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

import httpx
from pydantic import Field

from asearch.config import Config
from asearch.errors import RemoteError, ToolError
from asearch.net import LoopClient
from asearch.web.api import BodyTooLarge, read_limited, retry_after_s
from asearch.web.extract import Favor, parse_content_type, sniff_type
from asearch.web.resilience import ResilienceConfig, TransientError
from asearch.web.ssrf import (
    GuardedTransport,
    Resolver,
    SsrfBlocked,
    UrlPolicy,
    check_url,
    shown_url,
    url_text_problem,
)

REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})
# Answers that say the page does not exist (cached as such, so a replay sees the same).
GONE_STATUS = frozenset({404, 410})
# Where `_hold_location` keeps a response's Location header, out of httpx's sight.
_LOCATION = "asearch.location"


class FetchConfig(Config):
    """How `access` fetches pages itself (the `direct` reader)."""

    guard: UrlPolicy = Field(
        default_factory=UrlPolicy, description="Which hosts and addresses may be fetched."
    )
    resilience: ResilienceConfig = Field(
        default_factory=lambda: ResilienceConfig(timeout_s=20.0, retries=1, breaker_failures=0),
        description="Timeouts and retries; no circuit breaker by default (failures are per site, not one "
        "service).",
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Limit of a TCP/TLS connect, per hop.")
    max_bytes: int = Field(5_000_000, ge=1, description="Largest body read (after decompression).")
    max_redirects: int = Field(5, ge=0, description="Redirect hops followed, each checked by the guard.")
    content_types: list[str] = Field(
        default_factory=lambda: [
            "text/html",
            "application/xhtml+xml",
            "text/plain",
            "text/markdown",
            "application/pdf",
        ],
        description="Media types read; others are refused with an observation (images, archives, ...).",
    )
    extract_favor: Favor = Field(
        "balanced",
        description="HTML extraction: balanced, recall (keep more) or precision (keep less chrome).",
    )
    user_agent: str = Field(
        "asearch/0.1 (research agent; +https://github.com/asearch)", description="User-Agent."
    )
    max_connections: int = Field(32, ge=1, description="Open connections at most.")


class _Redirect(Exception):  # noqa: N818 (control flow inside SafeFetcher, never escapes it)
    def __init__(self, location: str):
        self.location = location


async def _hold_location(response: httpx.Response) -> None:
    """Take the Location header away before httpx reads it: httpx parses it for `next_request` even when
    not following redirects, and a malformed one raises there (InvalidURL, or a retried protocol error)."""
    location = response.headers.get("location")
    if location is not None:
        del response.headers["location"]
        response.extensions[_LOCATION] = location


def redirect_target(current: httpx.URL, location: str, policy: UrlPolicy) -> httpx.URL:
    """The vetted url a redirect from `current` to `location` leads to. A location that cannot be a valid
    url, or one the guard refuses, raises SsrfBlocked naming it and why (never retried: it stays invalid)."""
    shown, origin = shown_url(location), f"(a redirect from {current})"
    problem = url_text_problem(location)
    if problem:
        raise SsrfBlocked(shown, f"{problem} {origin}")
    try:
        joined = current.join(location)
    except (httpx.InvalidURL, ValueError) as e:
        raise SsrfBlocked(shown, f"not a valid url ({e}) {origin}") from None
    try:
        return check_url(joined, policy)  # every hop is vetted like the first
    except SsrfBlocked as e:
        raise SsrfBlocked(e.target, f"{e.reason} {origin}") from None


class FetchRefused(ToolError):
    """The page exists but will not be read (media type, size, redirect loop); shown to the agent."""


class PageGone(RemoteError):
    """The server says the page does not exist (HTTP 404 / 410)."""


@dataclass(frozen=True, slots=True)
class FetchedBody:
    """A fetched page before extraction: the final url after redirects and the raw body."""

    url: str
    final_url: str
    status: int
    mime: str
    charset: str | None
    body: bytes
    redirects: list[str] = field(default_factory=list)


class SafeFetcher:
    """`await fetch(url)` -> FetchedBody, or raises SsrfBlocked / FetchRefused (ToolError, not retried)
    or PageGone / TransientError / RemoteError. One attempt; retries belong to the caller's Resilience."""

    def __init__(
        self,
        config: FetchConfig | None = None,
        *,
        resolver: Resolver | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        self.config = config or FetchConfig()
        self._resolver = resolver
        self._ssl_context = ssl_context  # None: the system's verifying default (certifi when installed)
        self._transport: GuardedTransport | None = None  # the current loop's client's
        self._http = LoopClient(self._new_client)

    @property
    def blocked(self) -> int:
        """Connections the socket-level guard refused (url-level refusals raise before any socket)."""
        return self._transport.backend.blocked if self._transport is not None else 0

    def _new_client(self) -> httpx.AsyncClient:
        c = self.config
        self._transport = GuardedTransport(
            c.guard,
            resolver=self._resolver,
            max_connections=c.max_connections,
            ssl_context=self._ssl_context,
        )
        return httpx.AsyncClient(
            transport=self._transport,
            timeout=httpx.Timeout(c.resilience.timeout_s, connect=c.connect_timeout_s),
            follow_redirects=False,  # we follow them ourselves, checking each hop
            event_hooks={"response": [_hold_location]},
            trust_env=False,  # an env proxy would resolve names itself, around the guard
            headers={
                "User-Agent": c.user_agent,
                "Accept": ", ".join([*c.content_types, "*/*;q=0.1"]),
            },
        )

    async def fetch(self, url: str) -> FetchedBody:
        c = self.config
        current = check_url(url, c.guard)
        redirects: list[str] = []
        while True:
            try:
                return await self._hop(url, current, redirects)
            except _Redirect as r:
                if len(redirects) >= c.max_redirects:
                    raise FetchRefused(
                        f"{url} redirects more than {c.max_redirects} times; not followed"
                    ) from None
                current = redirect_target(current, r.location, c.guard)
                redirects.append(str(current))
            except SsrfBlocked as e:  # the socket-level guard refused a hop's resolved address
                if not redirects:
                    raise
                raise SsrfBlocked(e.target, f"{e.reason} (reached by a redirect to {current})") from None

    async def _hop(self, url: str, current: httpx.URL, redirects: list[str]) -> FetchedBody:
        """One request of the chain; a redirect answer raises _Redirect for `fetch` to vet and follow."""
        c = self.config
        async with self._http.get().stream("GET", current) as resp:
            location = resp.extensions.get(_LOCATION)
            if resp.status_code in REDIRECT_STATUS and location:
                raise _Redirect(location)
            if resp.status_code in GONE_STATUS:
                raise PageGone(f"{current} answered HTTP {resp.status_code} (the page does not exist)")
            if resp.status_code in (408, 425, 429) or resp.status_code >= 500:
                raise TransientError(
                    f"{current} answered HTTP {resp.status_code}", retry_after_s=retry_after_s(resp.headers)
                )
            if resp.status_code >= 400 or resp.status_code < 200:
                raise RemoteError(f"{current} answered HTTP {resp.status_code}")
            mime, charset = parse_content_type(resp.headers.get("content-type"))
            if mime and mime not in c.content_types:
                raise FetchRefused(f"{current} is {mime}; access reads only {', '.join(c.content_types)}")
            try:
                body = await read_limited(resp, c.max_bytes, f"the page {current}")
            except BodyTooLarge as e:
                raise FetchRefused(str(e)) from None
            if not mime:
                mime = sniff_type(body)
                if mime not in c.content_types:
                    raise FetchRefused(f"{current} looks like {mime}, which access does not read")
            return FetchedBody(
                url=url,
                final_url=str(current),
                status=resp.status_code,
                mime=mime,
                charset=charset,
                body=body,
                redirects=list(redirects),
            )

    async def aclose(self) -> None:
        await self._http.aclose()
