"""The retrieval seam: a `Retriever` maps queries to ranked passages, a `PageStore` maps urls to pages.

Search methods (`tools.method`, `asearch serve --method`) are registered by name: a method is a function
`(index: Index) -> Retriever` under `@register_search_method("name")` in a module of `asearch.retrieval`
(bm25, dense and hybrid in index.py), found on the first lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from asearch.corpus.types import Page, Passage
from asearch.registry import Registry


@dataclass(frozen=True, slots=True)
class SearchHit:
    passage: Passage
    score: float


@runtime_checkable
class Retriever(Protocol):
    """Synchronous, batched search. Implementations must be safe to call from a worker thread."""

    name: str

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        """Return, for each query, up to `topk` hits, best first."""
        ...


@runtime_checkable
class PageStore(Protocol):
    """url -> full page text; `None` for an unknown url."""

    def get(self, url: str) -> Page | None: ...

    def __len__(self) -> int: ...


OpenRetriever = Callable[[Any], Retriever]  # (an opened Index) -> its retriever of this method
SEARCH_METHODS: Registry[OpenRetriever] = Registry(
    "search method", "asearch.retrieval", wants=lambda source: "@register_search_method(" in source
)


def register_search_method(name: str) -> Callable[[OpenRetriever], OpenRetriever]:
    """Make the decorated `(index) -> Retriever` the search method `method=<name>` opens (once per index)."""
    return SEARCH_METHODS.decorator(name)
