"""What every web backend of a run shares: the cache, the cost meter and per-service call counters, and
the one path a web call takes (cache -> budget -> resilient request -> cache). `metrics()` flattens it
all under `web/` for a run's metrics.jsonl, and `web_metrics(tools)` finds it behind an agent's tools."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from asearch.corpus.types import Passage
from asearch.retrieval.base import SearchHit
from asearch.web.cache import CacheMiss, WebCache, normalize_query
from asearch.web.cost import CostMeter
from asearch.web.resilience import Resilience, ResilienceConfig


class WebRuntime:
    """Shared state of the web tools of one process. Build one per run and hand it to every backend so
    cache hit rates and spending add up across search and access."""

    def __init__(self, cache: WebCache | None = None, costs: CostMeter | None = None):
        self.cache = cache if cache is not None else WebCache.disabled()
        self.costs = costs if costs is not None else CostMeter()
        self.services: dict[str, Resilience] = {}
        self.counters: dict[str, int] = {}

    def service(self, name: str, config: ResilienceConfig | None = None) -> Resilience:
        """The call policy of service `name` (one breaker and one set of counters per name)."""
        svc = self.services.get(name)
        if svc is None:
            svc = self.services[name] = Resilience(name, config)
        return svc

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    async def cached_call(
        self,
        namespace: str,
        key: str,
        *,
        service: Resilience,
        provider: str,
        fetch: Callable[[], Awaitable[Any]],
    ) -> Any:
        """The cached value under (namespace, key); else `fetch()` run as a paid, resilient call, then
        stored. In cache_only mode a miss raises CacheMiss and nothing is sent."""
        hit = await self.cache.get(namespace, key)
        if hit is not None:
            return hit
        if self.cache.mode == "cache_only":
            raise CacheMiss(
                f"{key!r} is not in the web cache ({namespace}) and the cache is in cache_only mode, "
                "so no request is made"
            )

        async def paid_attempt() -> Any:
            with self.costs.paid_call(provider):
                return await fetch()

        value = await service.run(paid_attempt)
        await self.cache.put(namespace, key, value)
        return value

    def stats(self) -> dict[str, dict[str, float]]:
        """Nested counters: {"cache": {...}, "cost": {...}, "<service>": {...}, "guard": {...}}."""
        out: dict[str, dict[str, float]] = {"cache": self.cache.stats(), "cost": self.costs.stats()}
        for name, svc in sorted(self.services.items()):
            out[name] = svc.stats()
        if self.counters:
            out["events"] = {k: float(v) for k, v in sorted(self.counters.items())}
        return out

    def metrics(self, prefix: str = "web/", *, end_step: bool = False) -> dict[str, float]:
        """`stats()` flattened to `{"web/cache/hit_rate": 0.5, "web/cost/total_usd": ..., ...}` for
        `RunDir.log`. `end_step=True` also closes the cost step (its `step_usd` restarts at zero)."""
        flat = {
            f"{prefix}{group}/{name}": float(value)
            for group, values in self.stats().items()
            for name, value in values.items()
        }
        if end_step:
            self.costs.end_step()
        return flat

    def close(self) -> None:
        self.cache.close()


def web_metrics(tools: Mapping[str, Any], *, end_step: bool = False) -> dict[str, float]:
    """`metrics()` of the WebRuntime behind an agent's tools (`{"web/cache/hit_rate": ..., ...}`), or {}
    when no tool is a web tool. Eval and training call this on whatever tools the config built, so they
    need no web-specific wiring; the backends of one `open_web` share one runtime."""
    for tool in tools.values():
        runtime = getattr(getattr(tool, "backend", None), "runtime", None)
        if isinstance(runtime, WebRuntime):
            return runtime.metrics(end_step=end_step)
    return {}


# --------------------------------------------------------------------------- search backends


def hits_from_rows(rows: list[dict[str, Any]], topk: int) -> list[SearchHit]:
    """Cached result rows (`{"title", "url", "snippet"}`, best first) as SearchHits scored 1/rank; the
    passage id is the url, so `access` can open it."""
    return [
        SearchHit(
            passage=Passage(id=r["url"], title=r.get("title", ""), text=r.get("snippet", ""), url=r["url"]),
            score=1.0 / rank,
        )
        for rank, r in enumerate(rows[:topk], 1)
    ]


class CachedSearchBackend:
    """Base of the web search backends: `async search(queries, topk)` (the SearchTool seam), each query
    run concurrently through `WebRuntime.cached_call`. Subclasses set `provider` and implement
    `_request(query, topk) -> rows`."""

    provider: str = ""

    def __init__(self, runtime: WebRuntime | None, resilience: ResilienceConfig):
        self.runtime = runtime if runtime is not None else WebRuntime()
        self.service = self.runtime.service(self.provider, resilience)

    async def _request(self, query: str, topk: int) -> list[dict[str, Any]]:
        raise NotImplementedError

    def cache_key(self, query: str, topk: int) -> str:
        return f"{normalize_query(query)}|k={topk}"

    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        async def one(query: str) -> list[SearchHit]:
            rows = await self.runtime.cached_call(
                f"search/{self.provider}",
                self.cache_key(query, topk),
                service=self.service,
                provider=self.provider,
                fetch=lambda: self._request(query, topk),
            )
            return hits_from_rows(rows, topk)

        return list(await asyncio.gather(*(one(q) for q in queries)))
