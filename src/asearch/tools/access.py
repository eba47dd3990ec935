"""The `access` tool: a url in, the page text out as at most 10 marked chunks of 25,000 characters.

The agent reads one chunk per turn, so the chunks travel in `metadata["chunks"]`. Urls are
normalised first (see `asearch.retrieval.protocol.url_variants`); an unknown url is an observation.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.errors import ToolError
from asearch.retrieval.base import PageStore
from asearch.retrieval.protocol import lookup_page, normalize_url
from asearch.tools.base import EpisodeContext, Observation, ToolArgumentError, ToolSources, argument_text
from asearch.tools.registry import register_tool
from asearch.tools.render import chunk_page, render_page_not_found, render_page_read_to_end


class AccessToolConfig(Config):
    """How `access` cuts a page for reading."""

    chunk_chars: int = Field(25_000, ge=1, description="Characters per page chunk (one reading turn each).")
    max_chunks: int = Field(10, ge=1, description="Chunks kept; text beyond them is dropped, with a note.")
    chunks_per_call: int | None = Field(
        None,
        ge=1,
        description="None: one call shows every chunk (each read in its own turn, as ASearcher does). N: a call "
        "shows the next N chunks of the page, and opening the same url again in the episode goes on where it "
        "stopped, so the agent decides after each chunk whether to read on (docs/tools.md).",
    )
    cut_at_lines: bool = Field(
        True, description="End a chunk after a line break in its second half when it has one (lines are not cut in two)."
    )


@runtime_checkable
class PageBackend(Protocol):
    """Async batched page lookup; `RetrievalClient` is one, `LocalPageBackend` wraps a PageStore."""

    async def access(self, urls: Sequence[str]) -> list[Page | None]: ...


class LocalPageBackend:
    """An in-process PageStore, read in one dedicated thread (stores may do disk I/O or hold
    per-thread handles), never on the event loop."""

    def __init__(self, pages: PageStore):
        self.pages = pages
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="asearch-pages")

    async def access(self, urls: Sequence[str]) -> list[Page | None]:
        urls = list(urls)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, lambda: [lookup_page(self.pages, u) for u in urls]
            )
        except Exception as e:
            raise ToolError(f"page store failed: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def as_page_backend(backend: PageBackend | PageStore) -> PageBackend:
    """A PageStore (synchronous `get`) is wrapped in LocalPageBackend; an async backend is kept."""
    if inspect.iscoroutinefunction(getattr(backend, "access", None)):
        return backend  # type: ignore[return-value]
    if isinstance(backend, PageStore):
        return LocalPageBackend(backend)
    raise TypeError(f"access backend must be a PageStore or have `async access(urls)`, got {backend!r}")


@dataclass(frozen=True, slots=True)
class AccessArgs:
    url: str


@register_tool
class AccessTool:
    """`access`: the argument is a url (or `{"url": "..."}`), usually one that search returned."""

    name = "access"
    argument_hint = "url"
    counter = "accesses"
    order = 20
    config_class = AccessToolConfig
    enabled_by_default = True

    def __init__(
        self, backend: PageBackend | PageStore, config: AccessToolConfig | dict[str, Any] | None = None
    ):
        self.backend = as_page_backend(backend)
        self.config = (
            config if isinstance(config, AccessToolConfig) else AccessToolConfig.model_validate(config or {})
        )

    @classmethod
    def from_sources(cls, sources: ToolSources, config: AccessToolConfig) -> AccessTool:
        return cls(sources.pages, config)

    @property
    def description(self) -> str:
        return "<access>url</access> shows the full page at a url"

    def parse(self, raw: str) -> AccessArgs:
        text = argument_text(raw, "url", self.name)
        url = normalize_url(text)
        if not url:
            raise ToolArgumentError("the url to access is empty")
        return AccessArgs(url=url)

    async def call(self, args: AccessArgs, episode: EpisodeContext) -> Observation:
        start = time.perf_counter()
        pages = await self.backend.access([args.url])
        page = pages[0] if pages else None
        if page is None:
            return Observation(
                text=render_page_not_found(args.url),
                metadata={
                    "tool": self.name,
                    "url": args.url,
                    "found": False,
                    "chunks": [],
                    "latency_s": round(time.perf_counter() - start, 6),
                },
            )
        episode.pages.append(page)
        cfg = self.config
        cut = chunk_page(page.contents, page.url, chunk_chars=cfg.chunk_chars, max_chunks=cfg.max_chunks, at_lines=cfg.cut_at_lines)
        chunks, first = cut.chunks, 0
        if cfg.chunks_per_call is not None:
            first = episode.read_chunks.get(page.url, 0)
            if first >= len(chunks):
                return self._read_to_end(page.url, len(chunks), start)
            chunks = chunks[first : first + cfg.chunks_per_call]
            episode.read_chunks[page.url] = first + len(chunks)
        return Observation(
            text="\n\n".join(chunks),
            metadata={
                "tool": self.name,
                "url": page.url,
                "requested_url": args.url,
                "title": page.title,
                "found": True,
                "chunks": chunks,
                "first_chunk": first,
                "page_count": len(cut.chunks),
                "total_chars": cut.total_chars,
                "truncated": cut.truncated,
                "dropped_chars": cut.dropped_chars,
                "latency_s": round(time.perf_counter() - start, 6),
            },
        )

    def _read_to_end(self, url: str, page_count: int, start: float) -> Observation:
        """Paging past the last chunk: say so (the agent read the whole page already)."""
        text = render_page_read_to_end(url, page_count)
        meta = {"tool": self.name, "url": url, "found": True, "chunks": [text], "first_chunk": page_count,
                "page_count": page_count, "latency_s": round(time.perf_counter() - start, 6)}  # fmt: skip
        return Observation(text=text, metadata=meta)
