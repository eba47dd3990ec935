"""The `search` tool: a query in, the top-k passages rendered as `[Doc k](url):` blocks out.

Backends: an in-process `Retriever` (concurrent calls micro-batched into one search in a worker
thread) or a remote retrieval server through `RetrievalClient`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from asearch.config import Config
from asearch.errors import ToolError
from asearch.retrieval.base import Retriever, SearchHit
from asearch.retrieval.batching import MicroBatcher
from asearch.tools.base import EpisodeContext, Observation, ToolArgumentError, ToolSources, argument_text
from asearch.tools.registry import register_tool
from asearch.tools.render import render_search


class SearchToolConfig(Config):
    """How `search` asks and how its results read."""

    topk: int = Field(5, ge=1, description="Passages per query (ASearcher trains with 5).")
    max_doc_chars: int = Field(
        5000, ge=1, description="Each passage's contents are cut at this many characters."
    )
    max_query_chars: int = Field(2000, ge=1, description="Longer queries are refused with an observation.")
    show_urls: bool = Field(
        True,
        description="Print each passage's url (what `access` opens). Without an access tool the urls only "
        "cost tokens (docs/tools.md).",
    )
    compact: bool = Field(
        False,
        description="One line per result, `[Doc k] text`, without the quoted title line: for pages whose text "
        "names their subject (the world's `pages=facts`). A tiny model then sees a name as the same tokens "
        "in the question and in the results, which is what copying needs.",
    )


@runtime_checkable
class SearchBackend(Protocol):
    """Async batched search; `RetrievalClient` is one, `LocalSearchBackend` wraps a Retriever."""

    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]: ...


class LocalSearchBackend:
    """An in-process Retriever behind a MicroBatcher: concurrent agents share one batched call in a
    worker thread, so the event loop never blocks and the retriever is called from one thread."""

    def __init__(self, retriever: Retriever, *, batch_window_ms: float = 0.0, max_batch: int = 256):

        self.retriever = retriever
        self._batcher = MicroBatcher(
            retriever, window_s=batch_window_ms / 1000, max_batch=max_batch, workers=1
        )

    async def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        try:
            return await self._batcher.search(queries, topk)
        except Exception as e:  # a retriever bug or resource error is this call's failure, not the agent's
            name = getattr(self.retriever, "name", type(self.retriever).__name__)
            raise ToolError(f"retriever {name!r} failed: {type(e).__name__}: {e}") from e

    def close(self) -> None:
        self._batcher.close()


def as_search_backend(backend: SearchBackend | Retriever) -> SearchBackend:
    """A Retriever (synchronous `search`) is wrapped in LocalSearchBackend; an async backend is kept."""
    if inspect.iscoroutinefunction(getattr(backend, "search", None)):
        return backend  # type: ignore[return-value]
    if isinstance(backend, Retriever):
        return LocalSearchBackend(backend)
    raise TypeError(
        f"search backend must be a Retriever or have `async search(queries, topk)`, got {backend!r}"
    )


@dataclass(frozen=True, slots=True)
class SearchArgs:
    query: str


@register_tool
class SearchTool:
    """`search`: the argument is the query text (or `{"query": "..."}`)."""

    name = "search"
    argument_hint = "query"
    counter = "searches"
    order = 10
    config_class = SearchToolConfig
    enabled_by_default = True

    def __init__(
        self, backend: SearchBackend | Retriever, config: SearchToolConfig | dict[str, Any] | None = None
    ):
        self.backend = as_search_backend(backend)
        self.config = (
            SearchToolConfig.model_validate(config or {})
            if not isinstance(config, SearchToolConfig)
            else config
        )

    @classmethod
    def from_sources(cls, sources: ToolSources, config: SearchToolConfig) -> SearchTool:
        return cls(sources.search, config)

    @property
    def description(self) -> str:
        urls = " with their urls" if self.config.show_urls else ""
        return f"<search>keywords</search> searches the encyclopedia and shows the top passages{urls}"

    def parse(self, raw: str) -> SearchArgs:
        text = argument_text(raw, "query", self.name)
        if not text:
            raise ToolArgumentError("the search query is empty")
        if len(text) > self.config.max_query_chars:
            raise ToolArgumentError(
                f"the search query has {len(text)} characters; the limit is {self.config.max_query_chars}"
            )
        return SearchArgs(query=text)

    async def call(self, args: SearchArgs, episode: EpisodeContext) -> Observation:
        start = time.perf_counter()
        results = await self.backend.search([args.query], self.config.topk)
        hits = results[0] if results else []
        text = render_search(
            hits, args.query, max_doc_chars=self.config.max_doc_chars, show_urls=self.config.show_urls,
            compact=self.config.compact,
        )
        return Observation(
            text=text,
            metadata={
                "tool": self.name,
                "query": args.query,
                "hit_count": len(hits),
                "urls": [h.passage.url for h in hits],
                "ids": [h.passage.id for h in hits],
                "scores": [float(h.score) for h in hits],
                "latency_s": round(time.perf_counter() - start, 6),
            },
        )
