"""HTTP plumbing shared by the web API clients (Serper, SearXNG, Jina): keys from the environment, one
httpx client per event loop, bounded body reads, and HTTP statuses turned into retryable or final errors
(`asearch.net`'s one retryable set; `Resilience` runs the retries under `asearch.net`'s one policy).

API base urls are operator configuration, not agent input, so these clients are not behind the SSRF
guard (a self-hosted SearXNG usually lives on localhost); urls the agent chooses are checked by the
callers (`asearch.web.ssrf`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import httpx

from asearch.errors import ConfigError, RemoteError
from asearch.net import RETRYABLE_STATUS, LoopClient, TransientError, parse_retry_after

RETRIED_STATUS = RETRYABLE_STATUS  # asearch.net's one set, under the name web modules import


def api_key_from_env(env_var: str | None, provider: str, *, required: bool) -> str | None:
    """The key in `$env_var`. Keys come only from the environment, so configs and logs never hold them."""
    key = os.environ.get(env_var, "").strip() if env_var else ""
    if not key and required:
        raise ConfigError(
            f"{provider} needs an API key in the environment variable {env_var}; set it, or run the web "
            "cache in cache_only mode to replay recorded results without calls"
        )
    return key or None


def redact(text: str, secret: str | None) -> str:
    """`text` with the secret replaced, for anything that may reach a log or the agent."""
    return text.replace(secret, "<redacted>") if secret else text


@dataclass(frozen=True, slots=True)
class ApiResponse:
    status: int
    headers: httpx.Headers
    body: bytes

    provider: str = ""

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError:
            start = self.body[:80].decode("utf-8", "replace")
            raise RemoteError(f"answered something that is not JSON: {start!r}") from None


class BodyTooLarge(RemoteError):
    """An answer went over the byte limit; it was not read further."""


async def read_limited(resp: httpx.Response, max_bytes: int, what: str) -> bytes:
    """The (decoded) body of a streamed response, refusing more than `max_bytes` bytes. The count is of
    decompressed bytes, so a small gzip bomb cannot blow up memory either."""
    declared = resp.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(f"{what} is {int(declared):,} bytes; the limit is {max_bytes:,}")
    parts: list[bytes] = []
    size = 0
    async for part in resp.aiter_bytes():
        size += len(part)
        if size > max_bytes:
            raise BodyTooLarge(f"{what} is over the {max_bytes:,}-byte limit; stopped reading")
        parts.append(part)
    return b"".join(parts)


def retry_after_s(headers: httpx.Headers) -> float | None:
    """The answer's Retry-After in seconds (a number or an HTTP date), None without one."""
    return parse_retry_after(headers.get("retry-after"))


def status_error(status: int, headers: httpx.Headers, body: bytes, *, key_env: str | None) -> RemoteError:
    """The error for a non-2xx answer: TransientError (retried) for 408/425/429/5xx, RemoteError otherwise.
    The text does not name the provider: `Resilience` puts its name in front."""
    detail = _detail(body)
    if status in RETRIED_STATUS:
        label = "rate limited" if status == 429 else "server error"
        return TransientError(
            f"{label} (HTTP {status}): {detail}", retry_after_s=retry_after_s(headers), status=status
        )
    if status in (401, 403) and key_env:
        return RemoteError(f"refused the request (HTTP {status}): {detail}; check the key in ${key_env}")
    return RemoteError(f"rejected the request (HTTP {status}): {detail}")


def _detail(body: bytes) -> str:
    try:
        obj = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace").strip() or "(empty body)"
    if isinstance(obj, dict):
        for k in ("message", "detail", "error", "readableMessage"):
            if isinstance(obj.get(k), str):
                return obj[k][:200]
    return json.dumps(obj)[:200]


class ApiClient:
    """Requests to one provider's API. Each request is one attempt; `Resilience` decides about retries."""

    def __init__(
        self,
        provider: str,
        *,
        timeout_s: float,
        max_connections: int,
        headers: dict[str, str] | None = None,
        secret: str | None = None,
        key_env: str | None = None,
        max_bytes: int = 10_000_000,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.provider = provider
        self.timeout_s, self.max_bytes = timeout_s, max_bytes
        self._headers = dict(headers or {})
        self._secret, self._key_env = secret, key_env
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = LoopClient(
            lambda: httpx.AsyncClient(
                timeout=timeout_s,
                limits=limits,
                transport=transport,
                headers=self._headers,
                follow_redirects=False,
                trust_env=False,
            )
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        params: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> ApiResponse:
        """One request; a non-2xx answer raises (see `status_error`), error texts never carry the key."""
        try:
            async with self._http.get().stream(
                method, url, json=json_body, params=params, headers=headers
            ) as resp:
                body = await read_limited(resp, self.max_bytes, "the answer")
                if not 200 <= resp.status_code < 300:
                    raise status_error(resp.status_code, resp.headers, body, key_env=self._key_env)
                return ApiResponse(resp.status_code, resp.headers, body, self.provider)
        except RemoteError as e:
            if self._secret and self._secret in str(e):
                raise type(e)(redact(str(e), self._secret)) from None
            raise
        except httpx.HTTPError as e:
            if self._secret and self._secret in str(e):  # transport errors name urls; keys never go in urls
                raise httpx.TransportError(redact(str(e), self._secret)) from None
            raise

    async def aclose(self) -> None:
        await self._http.aclose()
