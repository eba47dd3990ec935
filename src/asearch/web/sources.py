"""The web as a source for the agent's tools: `WebPageBackend` (direct fetch + extraction), the `WebConfig`
of a run, and `open_web(cfg)` that wires search, reader, cache and costs together into `WebSources`.

The backends plug into the same `SearchTool` / `AccessTool` as local corpora (`asearch.tools.build_tools`
with `tools.web` set), so rendering and page chunking are shared; failures reach the agent as
observations through `run_tool`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.web.cache import CacheConfig, WebCache, normalize_url_key
from asearch.web.cost import CostConfig, CostMeter
from asearch.web.extract import extract_text
from asearch.web.fetch import FetchConfig, PageGone, SafeFetcher
from asearch.web.jina import JinaConfig, JinaReaderBackend
from asearch.web.runtime import WebRuntime
from asearch.web.searxng import SearxngBackend, SearxngConfig
from asearch.web.serper import SerperBackend, SerperConfig
from asearch.web.ssrf import Resolver, SsrfBlocked, check_url


class WebPageBackend:
    """Pages fetched directly (behind the SSRF guard) and turned into text (HTML via trafilatura, PDF via
    pypdf); plugs into `AccessTool(WebPageBackend(...))`. A 404/410 is cached as such, so a cache-only
    replay answers the same "does not exist" observation."""

    provider = "direct"

    def __init__(
        self,
        config: FetchConfig | dict[str, Any] | None = None,
        *,
        runtime: WebRuntime | None = None,
        resolver: Resolver | None = None,
    ):
        self.config = config if isinstance(config, FetchConfig) else FetchConfig.model_validate(config or {})
        self.runtime = runtime if runtime is not None else WebRuntime()
        self.service = self.runtime.service(self.provider, self.config.resilience)
        self.fetcher = SafeFetcher(self.config, resolver=resolver)

    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        return list(await asyncio.gather(*(self._one(u) for u in urls)))

    async def _one(self, url: str) -> Page:
        try:
            check_url(url, self.config.guard)  # refuse before the cache: a blocked url is never looked up
            value = await self.runtime.cached_call(
                "page/direct",
                normalize_url_key(url),
                service=self.service,
                provider=self.provider,
                fetch=lambda: self._request(url),
            )
        except SsrfBlocked:
            self.runtime.count("direct_blocked")
            raise
        if "gone" in value:
            raise PageGone(value["gone"])
        return Page(url=url, title=value.get("title", ""), contents=value.get("contents", ""))

    async def _request(self, url: str) -> dict[str, Any]:
        try:
            fetched = await self.fetcher.fetch(url)
        except PageGone as e:
            return {"gone": str(e)}
        text = await asyncio.to_thread(
            extract_text, fetched.body, fetched.mime, fetched.charset, fetched.final_url
        )
        return {"title": text.title, "contents": text.text, "final_url": fetched.final_url, "kind": text.kind}

    async def aclose(self) -> None:
        await self.fetcher.aclose()

    def __repr__(self) -> str:
        return f"WebPageBackend(allow_private={self.config.guard.allow_private})"


class WebConfig(Config):
    """The web tools of a run: which search API and reader, and how they cache, cost and fail."""

    search: Literal["serper", "searxng"] = Field("serper", description="Search provider behind `search`.")
    reader: Literal["direct", "jina"] = Field(
        "direct",
        description="How `access` reads pages: fetch them ourselves, or through a Jina-style reader.",
    )
    serper: SerperConfig = Field(
        default_factory=SerperConfig, description="The Serper API (used when search=serper)."
    )
    searxng: SearxngConfig = Field(
        default_factory=SearxngConfig, description="The SearXNG instance (used when search=searxng)."
    )
    jina: JinaConfig = Field(
        default_factory=JinaConfig, description="The Jina reader (used when reader=jina)."
    )
    fetch: FetchConfig = Field(
        default_factory=FetchConfig, description="The direct reader (used when reader=direct)."
    )
    cache: CacheConfig = Field(
        default_factory=CacheConfig,
        description="The persistent cache of results and pages; mode=cache_only replays it without calls.",
    )
    cost: CostConfig = Field(
        default_factory=CostConfig, description="Prices per call and the run's budget cap."
    )


@dataclass
class WebSources:
    """The backends behind web `search` (`search`) and `access` (`pages`), the shared `runtime` whose
    `metrics()` go into a run's metrics, and what `aclose` closes."""

    search: SerperBackend | SearxngBackend
    pages: WebPageBackend | JinaReaderBackend
    runtime: WebRuntime
    backends: list[Any] = field(default_factory=list)

    def metrics(self, *, end_step: bool = False) -> dict[str, float]:
        return self.runtime.metrics(end_step=end_step)

    async def aclose(self) -> None:
        for b in self.backends:
            await b.aclose()
        self.runtime.close()


def open_web(cfg: WebConfig | None = None, *, resolver: Resolver | None = None) -> WebSources:
    """Search and page backends over the web as configured, sharing one cache and cost meter. Raises
    ConfigError when a needed API key is missing from the environment (unless the cache is in
    cache_only mode)."""
    cfg = cfg or WebConfig()
    runtime = WebRuntime(WebCache.from_config(cfg.cache), CostMeter(cfg.cost))
    searcher: SerperBackend | SearxngBackend = (
        SerperBackend(cfg.serper, runtime=runtime)
        if cfg.search == "serper"
        else SearxngBackend(cfg.searxng, runtime=runtime)
    )
    reader: WebPageBackend | JinaReaderBackend = (
        WebPageBackend(cfg.fetch, runtime=runtime, resolver=resolver)
        if cfg.reader == "direct"
        else JinaReaderBackend(cfg.jina, runtime=runtime)
    )
    return WebSources(search=searcher, pages=reader, runtime=runtime, backends=[searcher, reader])
