"""Self-hosted metasearch through SearXNG's JSON API: `GET {base_url}/search?q=...&format=json`; results
are read from `results[].url / title / content`. The instance must enable `json` under `search.formats`
in its settings.yml (otherwise it answers 403)."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import Field

from asearch.config import Config
from asearch.errors import RemoteError
from asearch.web.api import ApiClient, api_key_from_env
from asearch.web.registry import register_search_provider
from asearch.web.resilience import ResilienceConfig
from asearch.web.runtime import CachedSearchBackend, WebRuntime


class SearxngConfig(Config):
    """A SearXNG instance."""

    base_url: str = Field(
        "http://127.0.0.1:8888", description="Instance root; requests go to {base_url}/search."
    )
    api_key_env: str | None = Field(
        None, description="Environment variable with a bearer token, for instances behind an auth proxy."
    )
    categories: str | None = Field(None, description="Comma-separated SearXNG categories, e.g. 'general'.")
    engines: str | None = Field(None, description="Comma-separated engines, e.g. 'wikipedia,duckduckgo'.")
    language: str | None = Field(None, description="Search language code, e.g. 'en'.")
    safesearch: int | None = Field(None, ge=0, le=2, description="0 off, 1 moderate, 2 strict.")
    resilience: ResilienceConfig = Field(
        default_factory=lambda: ResilienceConfig(timeout_s=15.0, retries=2, backoff_s=0.5),
        description="Timeouts, retries, concurrency, rate limit and breaker for this instance.",
    )


@register_search_provider("searxng", options=SearxngConfig)
class SearxngBackend(CachedSearchBackend):
    """Web search through a SearXNG instance; plugs into `SearchTool(SearxngBackend(...))`. SearXNG has no
    result-count parameter (about 20 per page), so the top `topk` of the first page are kept."""

    provider = "searxng"

    def __init__(
        self,
        config: SearxngConfig | dict[str, Any] | None = None,
        *,
        runtime: WebRuntime | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.config = (
            config if isinstance(config, SearxngConfig) else SearxngConfig.model_validate(config or {})
        )
        super().__init__(runtime, self.config.resilience)
        c = self.config
        key = api_key_from_env(c.api_key_env, "searxng", required=False)
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._api = ApiClient(
            "searxng",
            timeout_s=c.resilience.timeout_s,
            max_connections=c.resilience.max_concurrency,
            headers=headers,
            secret=key,
            key_env=c.api_key_env,
            transport=transport,
        )
        self._url = c.base_url.rstrip("/").removesuffix("/search") + "/search"

    async def _request(self, query: str, topk: int) -> list[dict[str, Any]]:
        c = self.config
        params: dict[str, Any] = {"q": query, "format": "json", "pageno": 1}
        for name in ("categories", "engines", "language", "safesearch"):
            value = getattr(c, name)
            if value is not None:
                params[name] = value
        try:
            resp = await self._api.request("GET", self._url, params=params)
        except RemoteError as e:
            if "HTTP 403" in str(e):
                raise RemoteError(
                    f"{e}; SearXNG answers 403 when the json format is off: add `json` to search.formats "
                    "in the instance's settings.yml"
                ) from None
            raise
        return parse_searxng(resp.json())[:topk]

    async def aclose(self) -> None:
        await self._api.aclose()

    def __repr__(self) -> str:
        return f"SearxngBackend({self._url!r})"


def parse_searxng(data: Any) -> list[dict[str, Any]]:
    """Rows `{"title", "url", "snippet"}` from a SearXNG JSON answer, in its order (already by score)."""
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise RemoteError("answered without a 'results' list; is base_url a SearXNG instance?")
    return [
        {"title": str(r.get("title") or ""), "url": r["url"], "snippet": str(r.get("content") or "")}
        for r in data["results"]
        if isinstance(r, dict) and isinstance(r.get("url"), str)
    ]
