"""Web search and page reading for the agent's `search` / `access` tools: Serper and SearXNG search, a
Jina-style reader and guarded direct fetches, with a persistent cache, cost accounting and an SSRF guard.

    tools = build_web_tools(WebConfig(...)).tools   # {"search": SearchTool, "access": AccessTool}
"""

from asearch.web.cache import CacheConfig, CacheMiss, WebCache, normalize_query, normalize_url_key
from asearch.web.cost import BudgetExceeded, CostConfig, CostMeter
from asearch.web.extract import ExtractedText, extract
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
from asearch.web.runtime import WebRuntime
from asearch.web.searxng import SearxngBackend, SearxngConfig
from asearch.web.serper import SerperBackend, SerperConfig
from asearch.web.ssrf import GuardedTransport, SsrfBlocked, UrlPolicy, address_problem, check_url
from asearch.web.tools import WebConfig, WebPageBackend, WebTools, build_web_tools

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
    "WebTools",
    "address_problem",
    "build_web_tools",
    "check_url",
    "extract",
    "normalize_query",
    "normalize_url_key",
]
