"""How one web service is called: bounded concurrency, a rate limit, per-attempt timeouts, retries under
`asearch.net`'s one policy (jittered backoff, Retry-After, the same retryable statuses as every other
client), and a circuit breaker that stops calling a service that keeps failing.

    RemoteError (asearch.errors)
    ├── TransientError     worth retrying: timeouts, connection failures, HTTP 408/425/429/5xx (asearch.net)
    └── CircuitOpen        the breaker is open; no request was sent
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import httpx
from pydantic import Field

from asearch.errors import RemoteError, ToolError
from asearch.net import GaveUp, RetryConfig, RetryPolicy, TransientError

__all__ = ["CircuitBreaker", "CircuitOpen", "RateLimiter", "Resilience", "ResilienceConfig", "TransientError"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Clock = Callable[[], float]


class CircuitOpen(RemoteError):
    """The service failed too often in a row; calls are refused without a request until the breaker resets."""


class ResilienceConfig(RetryConfig):
    """Timeouts, retries, concurrency, rate limit and circuit breaker of one web service. The retry knobs
    are `asearch.net.RetryConfig`'s (the older `attempts` still loads, as retries = attempts - 1)."""

    timeout_s: float = Field(15.0, gt=0, description="Limit of one attempt (connect + answer + body).")
    retries: int = Field(2, ge=0, description="Extra tries after the first; only transient failures are tried again.")
    backoff_s: float = Field(
        1.0, ge=0, description="Wait before retry k is backoff_s * 2**k (capped), times a 0.5-1 jitter."
    )
    max_retry_after_s: float = Field(
        8.0, ge=0, description="Cap on a server's Retry-After that is honoured (an agent turn waits for it)."
    )
    max_concurrency: int = Field(16, ge=1, description="Requests in flight at once to this service.")
    rate_per_s: float | None = Field(
        None, gt=0, description="Requests per second at most, over time (None = no limit)."
    )
    burst: int = Field(1, ge=1, description="Requests that may go at once before the rate limit applies.")
    breaker_failures: int = Field(
        5, ge=0, description="Consecutive failed calls that open the circuit breaker (0 = no breaker)."
    )
    breaker_reset_s: float = Field(
        30.0, gt=0, description="How long an open breaker refuses calls before it lets one trial through."
    )


class RateLimiter:
    """Token bucket: `burst` requests at once, then one every 1/rate seconds. Waiting callers queue in
    arrival order because each reserves its slot before sleeping (no lock needed on one event loop)."""

    def __init__(self, rate_per_s: float, burst: int = 1, *, clock: Clock = time.monotonic):
        self.rate, self.burst, self.clock = rate_per_s, burst, clock
        self._tokens = float(burst)
        self._stamp = clock()
        self._lock = threading.Lock()
        self.waited_s = 0.0

    def reserve(self) -> float:
        """Take a token; return how long the caller must wait before using it."""
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
            self._stamp = now
            self._tokens -= 1.0
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.rate
            self.waited_s += wait
            return wait

    async def acquire(self) -> None:
        wait = self.reserve()
        if wait > 0:
            await asyncio.sleep(wait)


BreakerState = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    """closed -> (`threshold` failed calls in a row) -> open -> (`reset_s` later) -> half_open: one trial
    call goes through; its success closes the breaker, its failure opens it again."""

    def __init__(self, name: str, threshold: int, reset_s: float, *, clock: Clock = time.monotonic):
        self.name, self.threshold, self.reset_s, self.clock = name, threshold, reset_s, clock
        self.state: BreakerState = "closed"
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.trips = 0
        self.refused = 0
        self._trial_in_flight = False
        self._lock = threading.Lock()

    def before_call(self) -> None:
        """Raise CircuitOpen unless a call may go now."""
        if self.threshold == 0:
            return
        with self._lock:
            if self.state == "closed":
                return
            remaining = self.opened_at + self.reset_s - self.clock()
            if self.state == "open" and remaining <= 0:
                self.state, self._trial_in_flight = "half_open", False
            if self.state == "half_open" and not self._trial_in_flight:
                self._trial_in_flight = True
                return
            self.refused += 1
            wait = f"next trial in {remaining:.0f} s" if remaining > 0 else "a trial call is in flight"
            raise CircuitOpen(
                f"{self.name}: circuit breaker open after {self.consecutive_failures} failed calls in a row; "
                f"no request sent ({wait})"
            )

    def release_trial(self) -> None:
        """A half-open trial that sent no request gives its slot back."""
        with self._lock:
            self._trial_in_flight = False

    def record_success(self) -> None:
        with self._lock:
            self.state, self.consecutive_failures, self._trial_in_flight = "closed", 0, False

    def record_failure(self) -> None:
        if self.threshold == 0:
            return
        with self._lock:
            self.consecutive_failures += 1
            if self.state == "half_open" or self.consecutive_failures >= self.threshold:
                if self.state != "open":
                    self.trips += 1
                    log.warning(
                        "%s: circuit breaker opened after %d failures", self.name, self.consecutive_failures
                    )
                self.state, self.opened_at, self._trial_in_flight = "open", self.clock(), False


class Resilience:
    """Runs calls to one service under its `ResilienceConfig` and counts what happened.

    `run(attempt)` calls `attempt()` (one request) under the retry policy of `asearch.net`, each try
    behind the rate limit, the concurrency bound and the per-try timeout. Transient failures
    (TransientError, timeouts, transport errors) are retried; other RemoteErrors fail at once; ToolErrors
    (a refused url, a spent budget) pass through untouched and are no fault of the service, and an
    httpx.InvalidURL becomes one (it is never retried). The last failure becomes
    `RemoteError("<name>: <problem> (3 attempts)")`.
    """

    def __init__(
        self,
        name: str,
        config: ResilienceConfig | None = None,
        *,
        clock: Clock = time.monotonic,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ):
        self.name = name
        self.config = config or ResilienceConfig()
        c = self.config
        self.breaker = CircuitBreaker(name, c.breaker_failures, c.breaker_reset_s, clock=clock)
        self.limiter = RateLimiter(c.rate_per_s, c.burst, clock=clock) if c.rate_per_s else None
        self.policy = RetryPolicy(c, sleep=sleep)
        self._semaphores: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}
        self.calls = self.successes = self.failures = self.refused = 0
        self.in_flight = self.max_in_flight = 0
        self.errors: dict[str, int] = {}

    @property
    def attempts(self) -> int:
        return self.policy.stats.requests

    @property
    def retries(self) -> int:
        return self.policy.stats.retries

    def _semaphore(self) -> asyncio.Semaphore:
        # A semaphore belongs to one event loop; tests and CLIs may run several loops one after another.
        loop = asyncio.get_running_loop()
        sem = self._semaphores.get(loop)
        if sem is None:
            self._semaphores = {k: v for k, v in self._semaphores.items() if not k.is_closed()}
            sem = self._semaphores[loop] = asyncio.Semaphore(self.config.max_concurrency)
        return sem

    async def _try(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """One try: after the rate limit, within the concurrency bound and the per-try timeout."""
        if self.limiter is not None:
            await self.limiter.acquire()
        async with self._semaphore():
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                async with asyncio.timeout(self.config.timeout_s):
                    return await attempt()
            finally:
                self.in_flight -= 1

    def _failed(self, kind: str, e: BaseException) -> None:
        self._count(kind)
        log.info("%s: attempt failed: %s", self.name, self._problem(kind, e))

    def _problem(self, kind: str, e: BaseException) -> str:
        if kind == "timeout":
            return f"timeout after {self.config.timeout_s:g} s"
        if kind == "connection" and not isinstance(e, TransientError):
            return f"connection failed ({type(e).__name__}: {e})"
        return str(e)

    async def run(self, attempt: Callable[[], Awaitable[T]]) -> T:
        self.calls += 1
        self.breaker.before_call()
        try:
            result = await self.policy.run(lambda: self._try(attempt), what=self.name, on_failure=self._failed)
        except GaveUp as e:
            self.failures += 1
            self.breaker.record_failure()
            tries = f" ({e.attempts} attempts)" if e.attempts > 1 else ""
            raise RemoteError(f"{self.name}: {self._problem(e.kind, e.last)}{tries}") from None
        except ToolError:  # refused (url guard, budget, media type): says nothing of the service's health
            self.refused += 1
            self.breaker.release_trial()
            raise
        except httpx.InvalidURL as e:  # no request was possible, and retrying will not make the url valid
            self.refused += 1
            self.breaker.release_trial()
            raise ToolError(f"{self.name}: refused a url that is not valid ({e})") from None
        except (RemoteError, httpx.HTTPError, TimeoutError) as e:  # a final answer: 4xx, bad data, bad encoding
            self.failures += 1
            self._count("rejected")
            self.breaker.record_success()  # the service answered; it is up
            raise RemoteError(f"{self.name}: {e}") from e
        self.successes += 1
        self.breaker.record_success()
        return result

    def _count(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def stats(self) -> dict[str, float]:
        """Counters for metrics: calls, failures, retries, breaker state (0 closed, 1 open, 0.5 half open)."""
        b = self.breaker
        out: dict[str, float] = {
            "calls": self.calls,
            "successes": self.successes,
            "failures": self.failures,
            "refused": self.refused,
            "retries": self.retries,
            "attempts": self.attempts,
            "max_in_flight": self.max_in_flight,
            "breaker_open": {"closed": 0.0, "half_open": 0.5, "open": 1.0}[b.state],
            "breaker_trips": b.trips,
            "breaker_refused": b.refused,
        }
        if self.limiter is not None:
            out["rate_limited_s"] = round(self.limiter.waited_s, 3)
        out.update({f"errors_{k}": v for k, v in sorted(self.errors.items())})
        return out
