"""Cost accounting: prices per call, totals per provider, per step and per run, and the hard budget that
stops paid calls (with a clear observation) while cached answers stay free."""

from __future__ import annotations

import asyncio

import pytest

from asearch.tools import SearchTool, run_tool
from asearch.web import BudgetExceeded, CostConfig, CostMeter, SerperBackend, WebCache, WebRuntime


def test_budget_stops_new_paid_calls(fake_web, tmp_path):
    rt = WebRuntime(
        WebCache(tmp_path / "c.sqlite"),
        CostMeter(CostConfig(per_call_usd={"serper": 0.004}, budget_usd=0.01)),
    )
    tool = SearchTool(SerperBackend({"base_url": fake_web.base_url}, runtime=rt))

    async def go():
        return [await run_tool(tool, q) for q in ("Oslen", "Kettering", "Brightwell", "Oslen")]

    first, second, refused, cached = asyncio.run(go())
    assert first.ok and second.ok and cached.ok and cached.text == first.text
    assert refused.error and refused.metadata["error"] == "tool"
    assert refused.text == (
        "search failed: the web budget is spent: $0.0080 of $0.0100 used, and a serper call costs $0.0040; "
        "no new paid calls are made (cached results still work)"
    )
    assert fake_web.hits["serper"] == 2  # the refused call sent nothing
    s = rt.costs.stats()
    assert (
        s["total_usd"] == pytest.approx(0.008)
        and s["refused"] == 1
        and s["budget_left_usd"] == pytest.approx(0.002)
    )


def test_failed_calls_are_not_billed(fake_web):
    rt = WebRuntime()
    backend = SerperBackend(
        {
            "base_url": fake_web.base_url,
            "resilience": {"retries": 0, "backoff_s": 0.0, "max_backoff_s": 0.0},
        },
        runtime=rt,
    )
    fake_web.fail_next("serper", 1, status=500)
    obs = asyncio.run(run_tool(SearchTool(backend), "Oslen"))
    assert obs.error and rt.costs.total_usd == 0.0 and rt.costs.reserved_usd == 0.0
    asyncio.run(backend.search(["Oslen"], 1))
    assert rt.costs.total_usd == pytest.approx(0.001)


def test_step_and_run_totals():
    meter = CostMeter(CostConfig(per_call_usd={"serper": 0.001, "jina": 0.0005}))
    for provider in ("serper", "serper", "jina"):
        with meter.paid_call(provider):
            pass
    assert meter.end_step() == pytest.approx(0.0025)
    with meter.paid_call("serper"):
        pass
    with meter.paid_call("direct"):  # unlisted or zero-priced: counted, free
        pass
    s = meter.stats()
    assert s["step_usd"] == pytest.approx(0.001) and s["total_usd"] == pytest.approx(0.0035)
    assert s["serper_calls"] == 3 and s["jina_usd"] == pytest.approx(0.0005) and s["direct_calls"] == 1


def test_concurrent_calls_cannot_overshoot_the_budget():
    meter = CostMeter(CostConfig(per_call_usd={"serper": 1.0}, budget_usd=2.0))

    async def call():
        with meter.paid_call("serper"):
            await asyncio.sleep(0.01)

    async def go():
        return await asyncio.gather(*(call() for _ in range(5)), return_exceptions=True)

    results = asyncio.run(go())
    assert sum(isinstance(r, BudgetExceeded) for r in results) == 3
    assert meter.total_usd == 2.0


def test_free_providers_run_past_a_spent_budget():
    meter = CostMeter(CostConfig(budget_usd=0.0))
    with meter.paid_call("searxng"):
        pass
    with pytest.raises(BudgetExceeded), meter.paid_call("serper"):
        pass


def test_prices_must_not_be_negative():
    with pytest.raises(ValueError, match="'serper': -1.0"):
        CostConfig(per_call_usd={"serper": -1.0})
