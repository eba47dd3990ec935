"""Serper-style Google search: `POST {base_url}/search` with header `X-API-KEY` and body `{"q", "num"}`;
results are read from `organic[].title / link / snippet`."""

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


class SerperConfig(Config):
    """A Serper-compatible search API."""

    base_url: str = Field(
        "https://google.serper.dev", description="API root; requests go to {base_url}/search."
    )
    api_key_env: str = Field("SERPER_API_KEY", description="Environment variable that holds the API key.")
    gl: str | None = Field(None, description="Country code of the results (Serper `gl`), e.g. 'us'.")
    hl: str | None = Field(None, description="Interface language (Serper `hl`), e.g. 'en'.")
    max_query_chars: int = Field(2000, ge=1, description="Longer queries are cut to this many characters.")
    resilience: ResilienceConfig = Field(
        default_factory=lambda: ResilienceConfig(
            timeout_s=20.0, retries=3, backoff_s=1.0, max_concurrency=20
        ),
        description="Timeouts, retries, concurrency, rate limit and breaker for this API.",
    )


@register_search_provider("serper", options=SerperConfig)
class SerperBackend(CachedSearchBackend):
    """Web search through a Serper-style API; plugs into `SearchTool(SerperBackend(...))`."""

    provider = "serper"

    def __init__(
        self,
        config: SerperConfig | dict[str, Any] | None = None,
        *,
        runtime: WebRuntime | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.config = (
            config if isinstance(config, SerperConfig) else SerperConfig.model_validate(config or {})
        )
        super().__init__(runtime, self.config.resilience)
        c = self.config
        key = api_key_from_env(c.api_key_env, "serper", required=self.runtime.cache.mode != "cache_only")
        self._api = ApiClient(
            "serper",
            timeout_s=c.resilience.timeout_s,
            max_connections=c.resilience.max_concurrency,
            headers={"X-API-KEY": key or "", "Content-Type": "application/json"},
            secret=key,
            key_env=c.api_key_env,
            transport=transport,
        )
        self._url = c.base_url.rstrip("/").removesuffix("/search") + "/search"

    async def _request(self, query: str, topk: int) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"q": query[: self.config.max_query_chars], "num": topk}
        if self.config.gl:
            body["gl"] = self.config.gl
        if self.config.hl:
            body["hl"] = self.config.hl
        resp = await self._api.request("POST", self._url, json_body=body)
        return parse_serper(resp.json())

    async def aclose(self) -> None:
        await self._api.aclose()

    def __repr__(self) -> str:  # never shows the key
        return f"SerperBackend({self._url!r})"


def parse_serper(data: Any) -> list[dict[str, Any]]:
    """Rows `{"title", "url", "snippet"}` from a Serper answer, in `position` order; entries without a
    link are skipped. An answer without an `organic` list is an error (not "no results")."""
    if not isinstance(data, dict) or not isinstance(data.get("organic", []), list):
        raise RemoteError("answered without an 'organic' result list; is base_url a Serper-style API?")
    if "organic" not in data and "searchParameters" not in data:
        raise RemoteError("answered without an 'organic' result list; is base_url a Serper-style API?")
    organic = [r for r in data.get("organic", []) if isinstance(r, dict) and isinstance(r.get("link"), str)]
    organic.sort(key=lambda r: r.get("position", 0) if isinstance(r.get("position"), int) else 0)
    return [
        {"title": str(r.get("title") or ""), "url": r["link"], "snippet": str(r.get("snippet") or "")}
        for r in organic
    ]
