"""What web calls cost: a per-call price table, running totals per provider, per step and per run, and a
hard budget that refuses new paid calls once it would be exceeded (cached answers stay free)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import Field, field_validator

from asearch.config import Config
from asearch.errors import ToolError

# Rough list prices in USD per successful call; set your plan's prices in config.
DEFAULT_PRICES_USD: dict[str, float] = {
    "serper": 0.001,  # about $1 per 1,000 queries at entry tiers
    "jina": 0.0002,  # billed by tokens; a rough per-page figure
    "searxng": 0.0,  # self-hosted
    "direct": 0.0,  # our own fetches
}


class CostConfig(Config):
    """Prices of web calls and the spending cap of a run."""

    per_call_usd: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_PRICES_USD),
        description="USD per successful call, by provider (serper, jina, searxng, direct); unlisted = free.",
    )
    budget_usd: float | None = Field(
        None,
        ge=0,
        description="Hard cap on paid calls for the run; beyond it they are refused (None = no cap).",
    )

    @field_validator("per_call_usd")
    @classmethod
    def _non_negative(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: p for k, p in v.items() if p < 0}
        if bad:
            raise ValueError(f"prices must be >= 0, got {bad}")
        return v


class BudgetExceeded(ToolError):
    """A paid call would go over the run's budget; no request was sent."""


class CostMeter:
    """Counts calls and spending by provider. `with meter.paid_call("serper"): ...` reserves the price
    before the request (so concurrent calls cannot overshoot the budget together), charges it when the
    block succeeds and gives it back when the block raises (a failed request is not billed)."""

    def __init__(self, config: CostConfig | None = None):
        self.config = config or CostConfig()
        self._lock = threading.Lock()
        self.spent_usd: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.step_usd = 0.0
        self.reserved_usd = 0.0
        self.refused = 0

    def price(self, provider: str) -> float:
        return self.config.per_call_usd.get(provider, 0.0)

    @property
    def total_usd(self) -> float:
        return sum(self.spent_usd.values())

    @contextmanager
    def paid_call(self, provider: str) -> Iterator[None]:
        price = self.price(provider)
        budget = self.config.budget_usd
        with self._lock:
            if (
                price > 0
                and budget is not None
                and self.total_usd + self.reserved_usd + price > budget + 1e-12
            ):
                self.refused += 1
                raise BudgetExceeded(
                    f"the web budget is spent: ${self.total_usd:.4f} of ${budget:.4f} used, and a {provider} "
                    f"call costs ${price:.4f}; no new paid calls are made (cached results still work)"
                )
            self.reserved_usd += price
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._lock:
                self.reserved_usd -= price
                if ok:
                    self.spent_usd[provider] = self.spent_usd.get(provider, 0.0) + price
                    self.calls[provider] = self.calls.get(provider, 0) + 1
                    self.step_usd += price

    def end_step(self) -> float:
        """Close the current step: return its spending and start the next at zero."""
        with self._lock:
            spent, self.step_usd = self.step_usd, 0.0
        return spent

    def stats(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = {
                "total_usd": round(self.total_usd, 6),
                "step_usd": round(self.step_usd, 6),
                "refused": self.refused,
            }
            if self.config.budget_usd is not None:
                out["budget_usd"] = self.config.budget_usd
                out["budget_left_usd"] = round(max(0.0, self.config.budget_usd - self.total_usd), 6)
            for p in sorted(set(self.spent_usd) | set(self.calls)):
                out[f"{p}_usd"] = round(self.spent_usd.get(p, 0.0), 6)
                out[f"{p}_calls"] = self.calls.get(p, 0)
        return out
