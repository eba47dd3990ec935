"""The web as a source for the agent's tools: `WebPageBackend` (direct fetch + extraction), the `WebConfig`
of a run, and `open_web(cfg)` that wires search, reader, cache and costs together into `WebSources`.

The backends plug into the same `SearchTool` / `AccessTool` as local corpora (`asearch.tools.build_tools`
with `tools.web` set), so rendering and page chunking are shared; failures reach the agent as
observations through `run_tool`. Providers and readers come from `asearch.web.registry`: `WebConfig` has a
section for each one registered (`tools.web.serper`, `tools.web.fetch`, ...).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field, create_model

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.web.cache import CacheConfig, WebCache, normalize_url_key
from asearch.web.cost import CostConfig, CostMeter
from asearch.web.extract import extract_text
from asearch.web.fetch import FetchConfig, PageGone, SafeFetcher
from asearch.web.registry import READERS, SEARCH_PROVIDERS, register_reader
from asearch.web.runtime import WebRuntime
from asearch.web.ssrf import Resolver, SsrfBlocked, check_url


@register_reader("direct", options=FetchConfig, section="fetch")
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


class WebSettings(Config):
    """The web tools of a run: which search API and reader, and how they cache, cost and fail."""

    search: SEARCH_PROVIDERS.name_type() = Field(
        "serper", description="Search provider behind `search` (serper, searxng or any registered one)."
    )
    reader: READERS.name_type() = Field(
        "direct",
        description="How `access` reads pages: fetch them ourselves (direct), through a Jina-style reader (jina), "
        "or any registered reader.",
    )
    cache: CacheConfig = Field(
        default_factory=CacheConfig,
        description="The persistent cache of results and pages; mode=cache_only replays it without calls.",
    )
    cost: CostConfig = Field(
        default_factory=CostConfig, description="Prices per call and the run's budget cap."
    )

    def options(self, section: str) -> Config:
        """The options of the provider or reader whose section is `section` (e.g. `serper`, `fetch`)."""
        return getattr(self, section)


def _web_config_model() -> type[WebSettings]:
    """WebSettings plus one section per registered search provider and reader (`serper`, `fetch`, ...)."""
    parts = [*((p, "search") for _, p in SEARCH_PROVIDERS.items()), *((p, "reader") for _, p in READERS.items())]
    sections: dict[str, Any] = {
        part.section: (
            part.options,
            Field(default_factory=part.options, description=f"The {part.name} {role} (used when {role}={part.name})."),
        )
        for part, role in parts
    }
    return create_model(  # type: ignore[call-overload, no-any-return]
        "WebConfig", __base__=WebSettings, __module__=__name__, __doc__=WebSettings.__doc__, **sections
    )


if TYPE_CHECKING:  # built at import, a section per registered provider and reader: the checker sees its base

    class WebConfig(WebSettings):
        def __getattr__(self, name: str) -> Any: ...  # the provider and reader sections (`serper`, `fetch`, ...)

else:
    WebConfig = _web_config_model()


@dataclass
class WebSources:
    """The backends behind web `search` (`search`) and `access` (`pages`), the shared `runtime` whose
    `metrics()` go into a run's metrics, and what `aclose` closes."""

    search: Any  # a registered search provider's backend: async search(queries, topk)
    pages: Any  # a registered reader's backend: async access(urls)
    runtime: WebRuntime
    backends: list[Any] = field(default_factory=list)

    def metrics(self, *, end_step: bool = False) -> dict[str, float]:
        return self.runtime.metrics(end_step=end_step)

    async def aclose(self) -> None:
        for b in self.backends:
            await b.aclose()
        self.runtime.close()


def open_web(cfg: WebSettings | None = None, *, resolver: Resolver | None = None) -> WebSources:
    """Search and page backends over the web as configured, sharing one cache and cost meter. Raises
    ConfigError when a needed API key is missing from the environment (unless the cache is in
    cache_only mode)."""
    cfg = cfg or WebConfig()
    runtime = WebRuntime(WebCache.from_config(cfg.cache), CostMeter(cfg.cost))
    search, read = SEARCH_PROVIDERS.get(cfg.search), READERS.get(cfg.reader)
    searcher = search.build(cfg.options(search.section), runtime=runtime, resolver=resolver)
    reader = read.build(cfg.options(read.section), runtime=runtime, resolver=resolver)
    return WebSources(search=searcher, pages=reader, runtime=runtime, backends=[searcher, reader])
