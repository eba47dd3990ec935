"""Hybrid retrieval: weighted reciprocal-rank fusion (RRF) of BM25 and dense rankings.

RRF score of passage d = sum over rankers i of  w_i / (k + rank_i(d)),  rank starting at 1; a passage a ranker
did not return contributes nothing for it. Scores of different engines are never compared, only ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import Field

from asearch.config import Config
from asearch.retrieval.base import SearchHit
from asearch.retrieval.store import PassageStore


class HybridConfig(Config):
    """How BM25 and dense rankings are fused."""

    k: int = Field(60, ge=1, description="RRF constant: larger flattens the advantage of the very top ranks.")
    bm25_weight: float = Field(1.0, ge=0, description="Weight of the BM25 ranking.")
    dense_weight: float = Field(1.0, ge=0, description="Weight of the dense ranking.")
    depth: int = Field(
        50, ge=1, description="Candidates taken from each ranker before fusing (at least topk)."
    )


class RowRanker(Protocol):
    name: str

    def search_rows(self, queries: Sequence[str], topk: int) -> list[list[tuple[int, float]]]: ...


def rrf_fuse(
    rankings: Sequence[Sequence[int]], weights: Sequence[float], k: int = 60
) -> list[tuple[int, float]]:
    """Fuse ranked lists of row ids into (row, rrf_score), best first; ties go to the lower row id."""
    if len(rankings) != len(weights):
        raise ValueError(f"{len(rankings)} rankings but {len(weights)} weights")
    fused: dict[int, float] = {}
    for ranking, w in zip(rankings, weights, strict=True):
        for rank, row in enumerate(ranking, start=1):
            fused[row] = fused.get(row, 0.0) + w / (k + rank)
    return sorted(fused.items(), key=lambda rs: (-rs[1], rs[0]))


class HybridRetriever:
    """BM25 + dense fused by RRF; the hit score is the fused RRF score."""

    name = "hybrid"

    def __init__(
        self, bm25: RowRanker, dense: RowRanker, store: PassageStore, cfg: HybridConfig | None = None
    ):
        self.bm25, self.dense, self.store = bm25, dense, store
        self.cfg = cfg or HybridConfig()

    def search_rows(self, queries: Sequence[str], topk: int) -> list[list[tuple[int, float]]]:
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not one string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        depth = max(self.cfg.depth, topk)
        lexical = self.bm25.search_rows(queries, depth)
        semantic = self.dense.search_rows(queries, depth)
        weights = (self.cfg.bm25_weight, self.cfg.dense_weight)
        return [
            rrf_fuse([[r for r, _ in a], [r for r, _ in b]], weights, self.cfg.k)[:topk]
            for a, b in zip(lexical, semantic, strict=True)
        ]

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        return [
            [SearchHit(passage=self.store[row], score=score) for row, score in ranked]
            for ranked in self.search_rows(queries, topk)
        ]
