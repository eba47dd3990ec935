"""Async client for the retrieval server (ours or any Search-R1/ASearcher-compatible one).

Connection errors and 5xx answers are retried with jittered exponential backoff, a bounded number of
times; anything else (4xx, bad data, read timeout, retries used up) raises `RemoteError` saying what to check.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from asearch.corpus.types import Page
from asearch.errors import RemoteError
from asearch.net import LoopClient
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

RETRIED_STATUS = frozenset({500, 502, 503, 504})


class RetrievalClient:
    """`search` / `access` / `health` / `stats` against a retrieval server at `base_url`.

    `timeout` bounds each attempt (seconds); `retries` is how many extra attempts a connect error or 5xx
    gets, waiting `backoff_s * 2**attempt` (capped at `max_backoff_s`, times a random 0.5-1 jitter so
    many clients do not retry in lockstep). Read timeouts are not retried: the server may still be
    working on the request, and repeating it would only add load.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
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
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = LoopClient(lambda: httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport))

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

    def _delay(self, attempt: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2**attempt) * random.uniform(0.5, 1.0)

    async def _call(self, method: str, path: str, payload: dict[str, Any] | None, model: type[R]) -> R:
        url = f"{self.base_url}{path}"
        attempts = self.retries + 1
        last = ""
        for attempt in range(attempts):
            try:
                resp = await self._http.get().request(method, url, json=payload)
            except (httpx.ReadTimeout, httpx.WriteTimeout) as e:
                raise RemoteError(
                    f"{method} {url} timed out after {self.timeout:g} s ({type(e).__name__}); the server is "
                    f"overloaded or the request is too large: check {self.base_url}/stats or raise the timeout"
                ) from e
            except httpx.TransportError as e:  # refused, reset, connect timeout: the request never ran
                last = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            else:
                if resp.status_code in RETRIED_STATUS:
                    last = f"HTTP {resp.status_code}: {_detail(resp)}"
                elif resp.status_code >= 400:
                    raise RemoteError(
                        f"{method} {url} was rejected (HTTP {resp.status_code}): {_detail(resp)}"
                    )
                else:
                    try:
                        return model.model_validate_json(resp.content)
                    except ValidationError as e:
                        raise RemoteError(
                            f"{method} {url} answered data that is not a {model.__name__}: "
                            f"{e.errors()[0]['msg']} at {'.'.join(map(str, e.errors()[0]['loc']))}; "
                            "is that url an asearch / Search-R1-compatible retrieval server?"
                        ) from None
            if attempt + 1 < attempts:
                await asyncio.sleep(self._delay(attempt))
        raise RemoteError(
            f"{method} {url} failed after {attempts} attempt(s) (last: {last}); check that the retrieval "
            f"server is running (`asearch serve --index DIR`) and that {self.base_url}/health answers"
        )


def _detail(resp: httpx.Response) -> str:
    """The server's `detail` message when it sent one, else the start of the body."""
    try:
        body = resp.json()
        if isinstance(body, dict) and "detail" in body:
            return str(body["detail"])
    except ValueError:
        pass
    return resp.text[:300] or resp.reason_phrase
