"""The one retry policy of asearch's HTTP clients (engines, web APIs, retrieval, judges, synthesis).

A call is tried `1 + retries` times. Between tries it waits `backoff_s * 2**k` (capped at `max_backoff_s`)
times a random 0.5-1 jitter, so clients that failed together do not come back in lock-step; a server's
Retry-After (seconds or an HTTP date) replaces that wait, capped at `max_retry_after_s`.

What is retried, and why:
- connection failures (refused, reset, connect and pool timeouts): the request never ran;
- read and write timeouts, unless `retry_timeouts` is off: a server may still be working on the request,
  and a client whose calls are cheap to lose but costly to repeat (retrieval) turns that off;
- the statuses in `RETRYABLE_STATUS`: 408 (request timeout), 425 (too early), 429 (rate limited), 500,
  502, 503, 504 (a server or a proxy in front of it that may recover). Other 5xx (501 not implemented,
  505 version not supported) and every other 4xx say the request itself is wrong: resending cannot fix it.

    RemoteError (asearch.errors)
    ├── TransientError     worth another try (`kind`, the server's `retry_after_s`, the `status`)
    ├── RemoteHTTPError    a final error status (`status_code`)
    └── GaveUp             the tries are used up; `last` is the last failure, `kind` its kind

The knob names are the same in every config that has them (`engine.http`, `engine.*` of kind openai, web
`resilience`, the retrieval client): `retries`, `backoff_s`, `max_backoff_s`, `max_retry_after_s`,
`retry_timeouts`. Older names still load with a FutureWarning (`DEPRECATED_KEYS`).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import httpx
from pydantic import Field, model_validator

from asearch.config import Config
from asearch.errors import RemoteError

log = logging.getLogger(__name__)

T = TypeVar("T")

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})

# old key -> new key (`attempts` counts the first try too: retries = attempts - 1)
DEPRECATED_KEYS = {
    "attempts": "retries",
    "backoff_base_s": "backoff_s",
    "backoff_max_s": "max_backoff_s",
    "retry_after_max_s": "max_retry_after_s",
}


class TransientError(RemoteError):
    """A failure that may pass on its own. `retry_after_s`: the server's hint (HTTP Retry-After), if any;
    `status`: the HTTP status that said so, if one did; `kind`: how it is counted (transient, timeout, ...)."""

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, status: int | None = None, kind: str = "transient"
    ):
        super().__init__(message)
        self.retry_after_s, self.status, self.kind = retry_after_s, status, kind


class RemoteHTTPError(RemoteError):
    """A server answered with an error status; `status_code` says which (e.g. 404: endpoint missing).
    None when no status came (the last of several failures was a connection error)."""

    def __init__(self, message: str, status_code: int | None, *, detail: str = ""):
        super().__init__(message)
        self.status_code, self.detail = status_code, detail  # detail: the gist of the error body


class GaveUp(RemoteError):
    """Every try failed; `last` is the last failure, `kind` its kind, `attempts` how many tries were made."""

    def __init__(self, message: str, *, last: BaseException, kind: str, attempts: int):
        super().__init__(message)
        self.last, self.kind, self.attempts = last, kind, attempts

    @property
    def status(self) -> int | None:
        return getattr(self.last, "status", None)


class RetryConfig(Config):
    """How often and how patiently a client tries a call again (module docstring: what is retried)."""

    retries: int = Field(3, ge=0, description="Extra tries after the first, on retryable failures only.")
    backoff_s: float = Field(
        0.5, ge=0, description="Wait before retry k is backoff_s * 2**k (capped), times a 0.5-1 jitter."
    )
    max_backoff_s: float = Field(8.0, ge=0, description="Cap on one backoff wait.")
    max_retry_after_s: float = Field(
        60.0, ge=0, description="Cap on a server's Retry-After that is honoured (it replaces the backoff)."
    )
    retry_timeouts: bool = Field(
        True, description="Retry read/write timeouts too (off: the server may still be working on the call)."
    )

    deprecated_keys: ClassVar[dict[str, str]] = DEPRECATED_KEYS

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        """Older names load as the new ones, with a FutureWarning; an old name wins over a default beside it."""
        if not isinstance(data, dict) or not set(data) & set(cls.deprecated_keys):
            return data
        data = dict(data)
        for old, new in cls.deprecated_keys.items():
            if old not in data:
                continue
            value = data.pop(old)
            if old == "attempts" and isinstance(value, int) and not isinstance(value, bool):
                if value < 1:
                    raise ValueError(f"attempts must be >= 1, got {value} (and is deprecated: give retries)")
                value -= 1
            warnings.warn(
                f"{cls.__name__}: '{old}' is deprecated, use '{new}'"
                + (" (= attempts - 1)" if old == "attempts" else ""),
                FutureWarning,
                stacklevel=2,
            )
            data[new] = value
        return data

    @model_validator(mode="after")
    def _backoff_cap(self) -> RetryConfig:
        if self.max_backoff_s < self.backoff_s:
            raise ValueError(f"max_backoff_s ({self.max_backoff_s}) is below backoff_s ({self.backoff_s})")
        return self

    @property
    def attempts(self) -> int:
        """Tries per call, the first included."""
        return self.retries + 1


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as seconds (either form the RFC allows: a number, or an HTTP date)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def status_failure(resp: httpx.Response, detail: str) -> TransientError | None:
    """The TransientError for a retryable status (None for any other): `detail` is the body's gist."""
    if resp.status_code not in RETRYABLE_STATUS:
        return None
    return TransientError(
        f"HTTP {resp.status_code}: {detail}",
        retry_after_s=parse_retry_after(resp.headers.get("retry-after")),
        status=resp.status_code,
    )


@dataclass(slots=True)
class RetryStats:
    """Counts since the policy was made: tries sent, retries among them, calls that failed for good."""

    requests: int = 0
    retries: int = 0
    failures: int = 0


class RetryPolicy:
    """Runs `attempt()` under a `RetryConfig`: `await policy.run(attempt, what="GET http://...")`.

    `attempt` makes one try and raises what went wrong; `failure_kind` says which of its errors are
    retried (anything else passes through at once). When the tries are used up, `run` raises `GaveUp`.
    """

    def __init__(self, cfg: RetryConfig | None = None, *, sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep):
        self.cfg = cfg or RetryConfig()
        self.stats = RetryStats()
        self._sleep = sleep

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Wait before retry number `retry` (0-based): the server's Retry-After (plus a jitter of at most a tenth
        of `backoff_s`, so clients told the same time do not return together), else jittered exponential."""
        c = self.cfg
        if retry_after is not None:
            return min(retry_after, c.max_retry_after_s) + random.uniform(0, 0.1 * c.backoff_s)
        return min(c.max_backoff_s, c.backoff_s * 2**retry) * random.uniform(0.5, 1.0)

    def failure_kind(self, e: BaseException) -> str | None:
        """How a failed try is counted when it is worth another (timeout, connection, transient), else None."""
        if isinstance(e, TransientError):
            return e.kind
        if isinstance(e, httpx.ConnectTimeout | httpx.PoolTimeout):
            return "connection"  # the request never reached the server
        if isinstance(e, TimeoutError | httpx.TimeoutException):
            return "timeout" if self.cfg.retry_timeouts else None
        if isinstance(e, httpx.TransportError):
            return "connection"
        return None

    async def run(
        self,
        attempt: Callable[[], Awaitable[T]],
        *,
        what: str,
        retries: int | None = None,
        on_failure: Callable[[str, BaseException], None] | None = None,
    ) -> T:
        """`attempt()` until it succeeds, fails with an error that is not retried, or the tries run out.
        `retries` overrides the config's for this call; `on_failure(kind, error)` sees each retryable failure."""
        n = (self.cfg.retries if retries is None else retries) + 1
        for k in range(n):
            if k:
                self.stats.retries += 1
            self.stats.requests += 1
            try:
                return await attempt()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                kind = self.failure_kind(e)
                if kind is None:
                    self.stats.failures += 1
                    raise
                if on_failure is not None:
                    on_failure(kind, e)
                if k + 1 == n:
                    self.stats.failures += 1
                    raise GaveUp(
                        f"{what} failed after {n} attempt{'s' if n > 1 else ''} (last: {describe(e)})",
                        last=e,
                        kind=kind,
                        attempts=n,
                    ) from e
                wait = self.delay(k, getattr(e, "retry_after_s", None))
                log.info("%s failed (%s); retry %d/%d in %.2fs", what, describe(e), k + 1, n - 1, wait)
                await self._sleep(wait)
        raise AssertionError("unreachable: the loop returns or raises")


def describe(e: BaseException) -> str:
    """One line for a failed try: a TransientError's own text, else the exception's type and message."""
    if isinstance(e, TransientError):
        return str(e)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
