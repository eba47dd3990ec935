"""Retries with backoff, timeouts, Retry-After, the circuit breaker, the rate limit and bounded concurrency,
against a loopback server that fails on command; and the pieces alone with an injected clock."""

from __future__ import annotations

import asyncio
import time

import pytest

from asearch.errors import RemoteError
from asearch.tools import SearchTool, run_tool
from asearch.web import CircuitBreaker, CircuitOpen, RateLimiter, Resilience, ResilienceConfig, SerperBackend


def fast(**overrides):
    """Short timeouts and near-zero backoff, so retries take milliseconds."""
    return {"timeout_s": 2.0, "retries": 2, "backoff_s": 0.01, "max_backoff_s": 0.05} | overrides


def serper(fake_web, **res):
    return SerperBackend({"base_url": fake_web.base_url, "resilience": fast(**res)})


def test_transient_errors_are_retried_until_success(fake_web):
    fake_web.fail_next("serper", 2, status=503)
    backend = serper(fake_web)
    (hits,) = asyncio.run(backend.search(["Oslen"], 2))
    assert hits and fake_web.hits["serper"] == 3
    s = backend.service.stats()
    assert s["retries"] == 2 and s["successes"] == 1 and s["failures"] == 0 and s["errors_transient"] == 2


def test_retries_used_up_become_one_observation(fake_web):
    fake_web.fail_next("serper", 5, status=502)
    obs = asyncio.run(run_tool(SearchTool(serper(fake_web)), "Oslen"))
    assert (
        obs.text == "search failed: serper: server error (HTTP 502): injected fault (HTTP 502) (3 attempts)"
    )
    assert obs.metadata["error"] == "remote" and fake_web.hits["serper"] == 3


def test_client_errors_are_not_retried(fake_web):
    fake_web.fail_next("serper", 5, status=400)
    obs = asyncio.run(run_tool(SearchTool(serper(fake_web)), "Oslen"))
    assert "HTTP 400" in obs.text and fake_web.hits["serper"] == 1


def test_timeouts_read_like_the_issue_says(fake_web):
    fake_web.delay_s["serper"] = 1.0
    backend = serper(fake_web, timeout_s=0.2, retries=1)
    t0 = time.perf_counter()
    obs = asyncio.run(run_tool(SearchTool(backend), "Oslen"))
    assert obs.text == "search failed: serper: timeout after 0.2 s (2 attempts)"
    assert time.perf_counter() - t0 < 1.5 and backend.service.stats()["errors_timeout"] == 2


def test_retry_after_is_honoured_within_the_cap(fake_web):
    fake_web.fail_next("serper", 1, status=429, Retry_After="0.3")
    backend = serper(fake_web, max_backoff_s=0.5)
    t0 = time.perf_counter()
    asyncio.run(backend.search(["Oslen"], 1))
    assert 0.3 <= time.perf_counter() - t0 < 2.0 and fake_web.hits["serper"] == 2


def test_breaker_opens_and_stops_calling_the_server(fake_web):
    fake_web.fail_next("serper", 100, status=500)
    backend = serper(fake_web, retries=0, breaker_failures=3, breaker_reset_s=60)
    tool = SearchTool(backend)

    async def go():
        return [await run_tool(tool, f"q{i}") for i in range(6)]

    observations = asyncio.run(go())
    assert fake_web.hits["serper"] == 3  # calls 4-6 never reached the server
    assert all("HTTP 500" in o.text for o in observations[:3])
    assert all("circuit breaker open after 3 failed calls" in o.text for o in observations[3:])
    s = backend.service.stats()
    assert s["breaker_open"] == 1.0 and s["breaker_trips"] == 1 and s["breaker_refused"] == 3


def test_breaker_half_opens_after_the_reset_time():
    now = [0.0]
    b = CircuitBreaker("svc", threshold=2, reset_s=10, clock=lambda: now[0])
    b.record_failure()
    b.before_call()  # still closed after one failure
    b.record_failure()
    with pytest.raises(CircuitOpen, match="next trial in 10 s"):
        b.before_call()
    now[0] = 10.5
    b.before_call()  # the trial call
    with pytest.raises(CircuitOpen, match="trial call is in flight"):
        b.before_call()
    b.record_failure()  # trial failed: open again for another 10 s
    assert b.state == "open" and b.trips == 2
    now[0] = 21.0
    b.before_call()
    b.record_success()
    assert b.state == "closed"
    b.before_call()


def test_rate_limiter_spaces_requests():
    now = [0.0]
    limiter = RateLimiter(rate_per_s=10, burst=2, clock=lambda: now[0])
    waits = [limiter.reserve() for _ in range(5)]
    assert waits == pytest.approx([0.0, 0.0, 0.1, 0.2, 0.3])
    now[0] = 10.0  # a long pause refills the bucket up to the burst only
    assert [limiter.reserve() for _ in range(3)] == pytest.approx([0.0, 0.0, 0.1])


def test_rate_limit_holds_on_the_wire(fake_web):
    backend = serper(fake_web, rate_per_s=20, burst=1)
    t0 = time.perf_counter()
    asyncio.run(backend.search([f"Oslen {i}" for i in range(6)], 1))
    assert time.perf_counter() - t0 >= 5 / 20 * 0.9  # six requests at 20/s need at least 0.25 s
    assert backend.service.stats()["rate_limited_s"] > 0


def test_concurrency_is_bounded(fake_web):
    fake_web.delay_s["serper"] = 0.1
    backend = serper(fake_web, max_concurrency=3)
    asyncio.run(backend.search([f"Kettering {i}" for i in range(9)], 1))
    assert fake_web.hits["serper"] == 9
    assert fake_web.max_in_flight["serper"] == 3 and backend.service.max_in_flight == 3


def test_non_transient_errors_fail_at_once_and_keep_the_breaker_closed():
    calls = []

    async def attempt():
        calls.append(1)
        raise RemoteError("HTTP 404")

    svc = Resilience("svc", ResilienceConfig(**fast(breaker_failures=1)))
    with pytest.raises(RemoteError, match="^svc: HTTP 404$"):
        asyncio.run(svc.run(attempt))
    assert len(calls) == 1 and svc.breaker.state == "closed"


def test_config_errors_show_values():
    with pytest.raises(ValueError, match=r"max_backoff_s \(0.1\) is below backoff_s \(1.0\)"):
        ResilienceConfig(backoff_s=1.0, max_backoff_s=0.1)
