"""The retrieval seam: a `Retriever` maps queries to ranked passages, a `PageStore` maps urls to pages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from asearch.corpus.types import Page, Passage


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
