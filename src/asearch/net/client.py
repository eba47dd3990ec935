"""HTTP clients per event loop, and the JSON client every remote part of asearch builds on.

    JsonClient(base_url, retry=RetryConfig(...), timeout_s=30)
      .request("POST", "/path", payload)   one call: tries under the RetryPolicy, on the loop's httpx client
      .request_json(...)                   the same, the body decoded

An httpx client's pooled connections belong to the event loop that opened them, so each loop (a fresh
`asyncio.run`, a server thread) gets its own client, made on first use there (`LoopClient`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx

from asearch.errors import RemoteError
from asearch.net.retry import GaveUp, RemoteHTTPError, RetryConfig, RetryPolicy, RetryStats, status_failure

POOL_SIZE = 16  # connections per httpx pool at most (see JsonClient)


class LoopClient:
    """The httpx client of the running event loop, made by `make()` on first use in each loop.

    A new loop gets a new client; `aclose` closes the current one. A client left behind by a loop that has
    ended is dropped with it (its sockets close with their transports): it cannot be awaited any more.
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
            http, loop, self._http = self._http, self._loop, None
            if loop is not asyncio.get_running_loop() and loop is not None and loop.is_closed():
                return  # its loop is gone, and its sockets with it
            try:
                await http.aclose()
            except RuntimeError:  # made on another loop that is still open: it closes with that loop
                pass


class JsonClient:
    """JSON calls to one base URL: every call goes through one `RetryPolicy` (asearch.net.retry).

    A retryable status raises TransientError inside a try (retried); any other status >= 400 raises
    `RemoteHTTPError` at once. When the tries are used up the last failure becomes `RemoteHTTPError` (its
    status) or `RemoteError` (a connection failure), with `hint` (what to check) after it.

    More than `POOL_SIZE` connections are split over several httpx pools, a call taking the least busy:
    httpcore's pool does work quadratic in its size on every request, which at 128 connections cost more
    CPU than the generation it carried.
    """

    def __init__(
        self,
        base_url: str,
        *,
        retry: RetryConfig | None = None,
        timeout_s: float = 30.0,
        connect_timeout_s: float | None = None,
        max_connections: int = 64,
        headers: dict[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        what: str = "server",
        hint: str = "",
    ):
        self.base_url = base_url.rstrip("/")
        self.policy = RetryPolicy(retry)
        self.what, self.hint = what, hint  # `what` names the server in errors, e.g. "vLLM server"
        self.closed = False
        timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s if connect_timeout_s else timeout_s)
        n_pools = -(-max_connections // POOL_SIZE)
        per_pool = -(-max_connections // n_pools)
        limits = httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool)

        def make() -> httpx.AsyncClient:
            return httpx.AsyncClient(
                base_url=self.base_url, headers=headers, timeout=timeout, limits=limits, transport=transport
            )

        self._pools = [LoopClient(make) for _ in range(n_pools)]
        self._busy = [0] * n_pools

    @property
    def stats(self) -> RetryStats:
        return self.policy.stats

    @property
    def retry(self) -> RetryConfig:
        return self.policy.cfg

    async def send(
        self, method: str, path: str, payload: Any = None, *, params: dict[str, Any] | None = None
    ) -> httpx.Response:
        """One try, no retries: the response of a status < 400, else the error it stands for."""
        url = f"{self.base_url}{path}"
        if self.closed:
            raise RemoteError(f"{self.what}: client closed; {method} {url} not sent")
        k = min(range(len(self._busy)), key=self._busy.__getitem__)
        self._busy[k] += 1
        try:
            resp = await self._pools[k].get().request(method, path, json=payload, params=params)
        except RuntimeError as e:  # httpx refuses to send on a client closed meanwhile
            if self.closed:
                raise RemoteError(f"{self.what}: client closed during {method} {url}") from e
            raise
        finally:
            self._busy[k] -= 1
        if resp.status_code < 400:
            return resp
        detail = error_detail(resp)
        transient = status_failure(resp, detail)
        if transient is not None:
            raise transient
        raise RemoteHTTPError(
            f"{self.what}: {method} {url} -> HTTP {resp.status_code}: {detail}\n"
            "A 4xx is not retried: check the request (model name, parameters) against the server's API.",
            resp.status_code,
            detail=detail,
        )

    async def request(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        retries: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """`send` under the retry policy (`retries` overrides the configured count for this call)."""
        try:
            return await self.policy.run(
                lambda: self.send(method, path, payload, params=params),
                what=f"{self.what}: {method} {self.base_url}{path}",
                retries=retries,
            )
        except GaveUp as e:
            msg = f"{e}" + (f"\n{self.hint}" if self.hint else "")
            raise (RemoteHTTPError(msg, e.status) if e.status is not None else RemoteError(msg)) from e.last

    async def request_json(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        retries: int | None = None,
        params: dict[str, Any] | None = None,
    ) -> Any:
        """`request`, the body decoded as JSON (None for an empty body)."""
        resp = await self.request(method, path, payload, retries=retries, params=params)
        if not resp.content:
            return None
        try:
            return resp.json()
        except ValueError:
            raise RemoteError(
                f"{self.what}: {method} {self.base_url}{path} answered non-JSON: {resp.text[:300]!r}"
            ) from None

    async def aclose(self) -> None:
        self.closed = True
        for pool in self._pools:
            await pool.aclose()


def error_detail(resp: httpx.Response, limit: int = 500) -> str:
    """The gist of an error body: its `detail`, `message` or `error` text when it is JSON, else its start."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in ("detail", "message", "error", "readableMessage"):
            value = body.get(key)
            if isinstance(value, dict) and isinstance(value.get("message"), str):  # OpenAI's error shape
                return value["message"][:limit]
            if isinstance(value, str):
                return value[:limit]
    return resp.text[:limit] or resp.reason_phrase
