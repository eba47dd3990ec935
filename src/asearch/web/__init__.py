"""Web search and page reading for the agent's `search` / `access` tools: Serper and SearXNG search, a
Jina-style reader and guarded direct fetches, with a persistent cache, cost accounting and an SSRF guard.

    web = open_web(WebConfig(...))   # web.search, web.pages: backends for SearchTool / AccessTool

Names are imported on first use, so `import asearch.web.cache` (or a subprocess that needs only the
cache) does not pay for the tool stack.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asearch.web.cache import CacheConfig, CacheMiss, WebCache, normalize_query, normalize_url_key
    from asearch.web.cost import BudgetExceeded, CostConfig, CostMeter
    from asearch.web.extract import ExtractedText, extract_text
    from asearch.web.fetch import FetchConfig, FetchedBody, FetchRefused, PageGone, SafeFetcher
    from asearch.web.jina import JinaConfig, JinaReaderBackend
    from asearch.web.resilience import (
        CircuitBreaker,
        CircuitOpen,
        RateLimiter,
        Resilience,
        ResilienceConfig,
        TransientError,
    )
    from asearch.web.runtime import WebRuntime, web_metrics
    from asearch.web.searxng import SearxngBackend, SearxngConfig
    from asearch.web.serper import SerperBackend, SerperConfig
    from asearch.web.sources import WebConfig, WebPageBackend, WebSources, open_web
    from asearch.web.ssrf import GuardedTransport, SsrfBlocked, UrlPolicy, address_problem, check_url

_WHERE: dict[str, str] = {
    "address_problem": "asearch.web.ssrf",
    "BudgetExceeded": "asearch.web.cost",
    "CacheConfig": "asearch.web.cache",
    "CacheMiss": "asearch.web.cache",
    "check_url": "asearch.web.ssrf",
    "CircuitBreaker": "asearch.web.resilience",
    "CircuitOpen": "asearch.web.resilience",
    "CostConfig": "asearch.web.cost",
    "CostMeter": "asearch.web.cost",
    "extract_text": "asearch.web.extract",
    "ExtractedText": "asearch.web.extract",
    "FetchConfig": "asearch.web.fetch",
    "FetchedBody": "asearch.web.fetch",
    "FetchRefused": "asearch.web.fetch",
    "GuardedTransport": "asearch.web.ssrf",
    "JinaConfig": "asearch.web.jina",
    "JinaReaderBackend": "asearch.web.jina",
    "normalize_query": "asearch.web.cache",
    "normalize_url_key": "asearch.web.cache",
    "open_web": "asearch.web.sources",
    "PageGone": "asearch.web.fetch",
    "RateLimiter": "asearch.web.resilience",
    "Resilience": "asearch.web.resilience",
    "ResilienceConfig": "asearch.web.resilience",
    "SafeFetcher": "asearch.web.fetch",
    "SearxngBackend": "asearch.web.searxng",
    "SearxngConfig": "asearch.web.searxng",
    "SerperBackend": "asearch.web.serper",
    "SerperConfig": "asearch.web.serper",
    "SsrfBlocked": "asearch.web.ssrf",
    "TransientError": "asearch.web.resilience",
    "UrlPolicy": "asearch.web.ssrf",
    "WebCache": "asearch.web.cache",
    "WebConfig": "asearch.web.sources",
    "WebPageBackend": "asearch.web.sources",
    "WebRuntime": "asearch.web.runtime",
    "WebSources": "asearch.web.sources",
    "web_metrics": "asearch.web.runtime",
}

__all__ = [
    "BudgetExceeded",
    "CacheConfig",
    "CacheMiss",
    "CircuitBreaker",
    "CircuitOpen",
    "CostConfig",
    "CostMeter",
    "ExtractedText",
    "FetchConfig",
    "FetchRefused",
    "FetchedBody",
    "GuardedTransport",
    "JinaConfig",
    "JinaReaderBackend",
    "PageGone",
    "RateLimiter",
    "Resilience",
    "ResilienceConfig",
    "SafeFetcher",
    "SearxngBackend",
    "SearxngConfig",
    "SerperBackend",
    "SerperConfig",
    "SsrfBlocked",
    "TransientError",
    "UrlPolicy",
    "WebCache",
    "WebConfig",
    "WebPageBackend",
    "WebRuntime",
    "WebSources",
    "address_problem",
    "check_url",
    "extract_text",
    "normalize_query",
    "normalize_url_key",
    "open_web",
    "web_metrics",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'asearch.web' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
