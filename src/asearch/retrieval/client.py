"""Async client for the retrieval server (ours or any Search-R1/ASearcher-compatible one).

Calls go through `asearch.net`'s one retry policy: connection errors and the retryable statuses (429, 5xx
from a proxy, ...) are tried again with jittered exponential backoff, a bounded number of times; anything
else (4xx, bad data, read timeout, retries used up) raises `RemoteError` saying what to check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from asearch.corpus.types import Page
from asearch.errors import RemoteError
from asearch.net import GaveUp, JsonClient, RemoteHTTPError, RetryConfig
from asearch.net.retry import describe
from asearch.retrieval.base import SearchHit
from asearch.retrieval.protocol import (
    AccessRequest,
    AccessResponse,
    HealthResponse,
    RetrieveRequest,
    ScoredRetrieveResponse,
    StatsResponse,
)

R = TypeVar("R", bound=BaseModel)


class RetrievalClient:
    """`search` / `access` / `health` / `stats` against a retrieval server at `base_url`.

    `timeout` bounds each attempt (seconds); `retries`, `backoff_s` and `max_backoff_s` are the retry
    policy's (`asearch.net.RetryConfig`; a server's Retry-After is honoured up to `max_retry_after_s`).
    Read timeouts are not retried (`retry_timeouts=False`): the server may still be working on the
    request, and repeating it would only add load.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
        max_retry_after_s: float = 30.0,
        max_connections: int = 64,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        url = base_url.rstrip("/")
        for endpoint in ("/retrieve", "/access"):  # people paste the endpoint url from Search-R1 configs
            if url.endswith(endpoint):
                url = url[: -len(endpoint)]
        self.base_url = url
        self.timeout, self.retries = timeout, retries
        retry = RetryConfig(
            retries=retries,
            backoff_s=backoff_s,
            max_backoff_s=max_backoff_s,
            max_retry_after_s=max_retry_after_s,
            retry_timeouts=False,
        )
        self._http = JsonClient(
            url,
            retry=retry,
            timeout_s=timeout,
            max_connections=max_connections,
            transport=transport,
            what="retrieval server",
        )

    # ------------------------------------------------------------------ public API

    async def search(self, queries: Sequence[str], topk: int = 5) -> list[list[SearchHit]]:
        """Top-`topk` hits per query, best first (scores always requested)."""
        queries = list(queries)
        if not queries:
            return []
        req = RetrieveRequest(queries=queries, topk=topk, return_scores=True)
        resp = await self._call(
            "POST", "/retrieve", req.model_dump(exclude_none=True), ScoredRetrieveResponse
        )
        if len(resp.result) != len(queries):
            raise RemoteError(
                f"{self.base_url}/retrieve answered {len(resp.result)} result lists for {len(queries)} queries"
            )
        return [[d.to_hit() for d in row] for row in resp.result]

    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        """The page for each url, or None where the server does not hold it."""
        urls = list(urls)
        if not urls:
            return []
        resp = await self._call("POST", "/access", AccessRequest(urls=urls).model_dump(), AccessResponse)
        if len(resp.result) != len(urls):
            raise RemoteError(
                f"{self.base_url}/access answered {len(resp.result)} pages for {len(urls)} urls"
            )
        return [None if p is None else p.to_page() for p in resp.result]

    async def health(self) -> HealthResponse:
        return await self._call("GET", "/health", None, HealthResponse)

    async def stats(self) -> StatsResponse:
        return await self._call("GET", "/stats", None, StatsResponse)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> RetrievalClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"RetrievalClient({self.base_url!r}, timeout={self.timeout:g}, retries={self.retries})"

    # ------------------------------------------------------------------ plumbing

    async def _call(self, method: str, path: str, payload: dict[str, Any] | None, model: type[R]) -> R:
        url = f"{self.base_url}{path}"
        try:
            resp = await self._http.policy.run(lambda: self._http.send(method, path, payload), what=f"{method} {url}")
        except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
            raise RemoteError(
                f"{method} {url} timed out after {self.timeout:g} s ({type(e).__name__}); the server is "
                f"overloaded or the request is too large: check {self.base_url}/stats or raise the timeout"
            ) from e
        except RemoteHTTPError as e:
            raise RemoteError(f"{method} {url} was rejected (HTTP {e.status_code}): {e.detail}") from None
        except GaveUp as e:
            raise RemoteError(
                f"{method} {url} failed after {e.attempts} attempt(s) (last: {describe(e.last)}); check that the "
                f"retrieval server is running (`asearch serve --index DIR`) and that {self.base_url}/health answers"
            ) from e.last
        try:
            return model.model_validate_json(resp.content)
        except ValidationError as e:
            raise RemoteError(
                f"{method} {url} answered data that is not a {model.__name__}: "
                f"{e.errors()[0]['msg']} at {'.'.join(map(str, e.errors()[0]['loc']))}; "
                "is that url an asearch / Search-R1-compatible retrieval server?"
            ) from None
