"""Jina-reader-style page reading: `GET {base_url}/{url}` with a bearer key; the reader fetches the page
and answers its text (JSON `{"data": {"title", "url", "content"}}`, or its plain-text format)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx
from pydantic import Field

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.errors import RemoteError
from asearch.web.api import ApiClient, api_key_from_env
from asearch.web.cache import normalize_url_key
from asearch.web.registry import register_reader
from asearch.web.resilience import ResilienceConfig
from asearch.web.runtime import WebRuntime
from asearch.web.ssrf import SsrfBlocked, UrlPolicy, check_url

log = logging.getLogger(__name__)


class JinaConfig(Config):
    """A Jina-reader-compatible service."""

    base_url: str = Field("https://r.jina.ai", description="Reader root; a page is read at {base_url}/{url}.")
    api_key_env: str = Field(
        "JINA_API_KEY", description="Environment variable with the bearer key (optional)."
    )
    guard: UrlPolicy = Field(
        default_factory=UrlPolicy,
        description="Urls the agent may ask the reader for. The reader resolves names itself, so only the "
        "url text is checked here (scheme, credentials, IP literals, local and metadata names).",
    )
    max_bytes: int = Field(10_000_000, ge=1, description="Largest answer read.")
    resilience: ResilienceConfig = Field(
        default_factory=lambda: ResilienceConfig(
            timeout_s=30.0, retries=1, backoff_s=1.0, max_concurrency=10
        ),
        description="Timeouts, retries, concurrency, rate limit and breaker for this service.",
    )


@register_reader("jina", options=JinaConfig)
class JinaReaderBackend:
    """Pages through a Jina-style reader; plugs into `AccessTool(JinaReaderBackend(...))`."""

    provider = "jina"

    def __init__(
        self,
        config: JinaConfig | dict[str, Any] | None = None,
        *,
        runtime: WebRuntime | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.config = config if isinstance(config, JinaConfig) else JinaConfig.model_validate(config or {})
        self.runtime = runtime if runtime is not None else WebRuntime()
        c = self.config
        self.service = self.runtime.service(self.provider, c.resilience)
        key = api_key_from_env(c.api_key_env, "jina", required=False)
        if key is None and self.runtime.cache.mode != "cache_only":
            log.warning(
                "jina: $%s is not set; the reader works without a key at a low rate limit", c.api_key_env
            )
        headers = {"Accept": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._api = ApiClient(
            "jina",
            timeout_s=c.resilience.timeout_s,
            max_connections=c.resilience.max_concurrency,
            headers=headers,
            secret=key,
            key_env=c.api_key_env,
            max_bytes=c.max_bytes,
            transport=transport,
        )
        self._base = c.base_url.rstrip("/")

    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        return list(await asyncio.gather(*(self._one(u) for u in urls)))

    async def _one(self, url: str) -> Page:
        try:
            check_url(url, self.config.guard)
        except SsrfBlocked:
            self.runtime.count("jina_blocked")
            raise
        value = await self.runtime.cached_call(
            "page/jina",
            normalize_url_key(url),
            service=self.service,
            provider=self.provider,
            fetch=lambda: self._request(url),
        )
        return Page(url=url, title=value.get("title", ""), contents=value.get("contents", ""))

    async def _request(self, url: str) -> dict[str, Any]:
        resp = await self._api.request("GET", f"{self._base}/{url}")
        ctype = resp.headers.get("content-type", "")
        if "json" in ctype:
            return parse_jina_json(resp.json(), url)
        return parse_jina_text(resp.body.decode("utf-8", "replace"))

    async def aclose(self) -> None:
        await self._api.aclose()

    def __repr__(self) -> str:
        return f"JinaReaderBackend({self._base!r})"


def parse_jina_json(data: Any, url: str) -> dict[str, Any]:
    """`{"title", "contents"}` from `{"code": 200, "data": {"title", "url", "content"}}`."""
    inner = data.get("data") if isinstance(data, dict) else None
    if not isinstance(inner, dict) or not isinstance(inner.get("content"), str):
        raise RemoteError(f"answered for {url} without data.content; is base_url a Jina-style reader?")
    return {"title": str(inner.get("title") or ""), "contents": inner["content"].strip()}


def parse_jina_text(text: str) -> dict[str, Any]:
    """The plain-text answer: `Title: ...`, `URL Source: ...`, then `Markdown Content:` and the page."""
    title = ""
    head, sep, rest = text.partition("Markdown Content:")
    if sep:
        for line in head.splitlines():
            if line.startswith("Title:"):
                title = line[len("Title:") :].strip()
        return {"title": title, "contents": rest.strip()}
    return {"title": "", "contents": text.strip()}
