"""BM25 over passages with tantivy: a streaming index writer and `BM25Retriever` (ties broken by passage row).

Why tantivy (and not bm25s / rank-bm25): see docs/retrieval.md and bench/retrieval.py. Queries are analysed in
Python with the same analyzer as the index and ORed as term queries, so no query syntax can be injected.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
from pydantic import Field, field_validator

from asearch.config import Config
from asearch.corpus.types import Passage
from asearch.retrieval.base import SearchHit

if TYPE_CHECKING:
    from asearch.retrieval.store import PassageStore

# Languages with both a tantivy stemmer and a builtin stopword list.
Language = Literal[
    "danish", "dutch", "english", "finnish", "french", "german", "hungarian",
    "italian", "norwegian", "portuguese", "russian", "spanish", "swedish",
]  # fmt: skip

_FIELD, _ROW = "contents", "row"
_ANALYZER = "asearch"
# Tantivy's BM25 constants are compiled in (tantivy/src/query/bm25.rs); the config records them, nothing more.
TANTIVY_K1, TANTIVY_B = 1.2, 0.75


class BM25Config(Config):
    """Analysis and indexing settings of the BM25 index (recorded in the manifest; queries reuse them)."""

    k1: float = Field(TANTIVY_K1, description="Term-frequency saturation. Fixed at 1.2 by tantivy.")
    b: float = Field(TANTIVY_B, description="Length normalisation. Fixed at 0.75 by tantivy.")
    stemmer: Language | None = Field("english", description="Snowball stemmer language; null = no stemming.")
    stopwords: Language | list[str] | None = Field(
        "english",
        description="Builtin stopword list by language, an explicit list of words, or null for none.",
    )
    lowercase: bool = Field(True, description="Lowercase tokens before stopwords and stemming.")
    max_token_chars: int = Field(
        40, ge=2, le=255, description="Drop tokens longer than this (ids, hashes, junk)."
    )
    threads: int = Field(1, ge=1, le=64, description="Indexing threads, and threads for a batch of queries.")
    heap_mb: int = Field(
        256, ge=16, description="Indexing memory budget (MB) shared by threads; larger = fewer segments."
    )
    max_tie_scan: int = Field(
        1000,
        ge=1,
        description="At most this many hits are fetched to order a tie at the top-k cut by passage row; "
        "beyond it a tie keeps tantivy's order (stable for one index, not across rebuilds).",
    )

    @field_validator("k1", "b")
    @classmethod
    def _fixed_by_engine(cls, v: float, info) -> float:
        fixed = {"k1": TANTIVY_K1, "b": TANTIVY_B}[info.field_name]
        if abs(v - fixed) > 1e-9:
            raise ValueError(f"tantivy scores with {info.field_name}={fixed} (compiled in), no other value")
        return v

    @field_validator("stopwords")
    @classmethod
    def _no_blank_stopwords(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and any(not w.strip() for w in v):
            raise ValueError(f"stopword list has blank entries: {v!r}")
        return v


def make_analyzer(cfg: BM25Config):
    """The tantivy text analyzer for `cfg`: simple tokenizer, long-token filter, lowercase, stopwords, stemmer."""
    import tantivy

    builder = tantivy.TextAnalyzerBuilder(tantivy.Tokenizer.simple()).filter(
        tantivy.Filter.remove_long(cfg.max_token_chars)
    )
    if cfg.lowercase:
        builder = builder.filter(tantivy.Filter.lowercase())
    if isinstance(cfg.stopwords, str):
        builder = builder.filter(tantivy.Filter.stopword(cfg.stopwords))
    elif cfg.stopwords:
        words = [w.lower() for w in cfg.stopwords] if cfg.lowercase else list(cfg.stopwords)
        builder = builder.filter(tantivy.Filter.custom_stopword(words))
    if cfg.stemmer:
        builder = builder.filter(tantivy.Filter.stemmer(cfg.stemmer))
    return builder.build()


def _schema():
    import tantivy

    sb = tantivy.SchemaBuilder()
    # freq, not positions: BM25 needs term frequencies only; positions would double the index for phrase queries
    sb.add_text_field(_FIELD, stored=False, tokenizer_name=_ANALYZER, index_option="freq")
    sb.add_unsigned_field(_ROW, stored=False, indexed=False, fast=True)
    return sb.build()


class BM25Writer:
    """Streams (row, text) pairs into a tantivy index at `directory`; tantivy flushes segments at `heap_mb`."""

    def __init__(self, directory: str | Path, cfg: BM25Config):
        import tantivy

        self._tantivy = tantivy
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.index = tantivy.Index(_schema(), path=str(self.dir))
        self.index.register_tokenizer(_ANALYZER, make_analyzer(cfg))
        heap = max(cfg.heap_mb * 2**20, 16 * 2**20 * cfg.threads)  # tantivy wants >= ~15 MB per thread
        self._writer = self.index.writer(heap_size=heap, num_threads=cfg.threads)
        self.count = 0

    def add(self, row: int, text: str) -> None:
        doc = self._tantivy.Document()
        doc.add_text(_FIELD, text)
        doc.add_unsigned(_ROW, row)  # add_unsigned: a plain int kwarg would make the column i64 and panic
        self._writer.add_document(doc)
        self.count += 1

    def close(self) -> dict[str, int]:
        self._writer.commit()
        self._writer.wait_merging_threads()
        self.index.reload()
        return {"documents": self.count, "segments": self.index.searcher().num_segments}


class BM25Retriever:
    """Ranked passages for each query; scores are tantivy BM25 (k1=1.2, b=0.75), ties ordered by passage row.

    Safe to call from several threads: the searcher is an immutable snapshot and the store reads are mmap slices.
    """

    name = "bm25"

    def __init__(self, directory: str | Path, cfg: BM25Config, store: PassageStore):
        import tantivy

        self._t = tantivy
        self.cfg = cfg
        self.store = store
        index = tantivy.Index.open(str(directory))
        self._schema = index.schema
        self._searcher = index.searcher()
        self._analyzer = make_analyzer(cfg)
        self._n = self._searcher.num_docs
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    def __len__(self) -> int:
        return self._n

    def analyze(self, text: str) -> list[str]:
        """The terms a query or passage turns into (what the index matches on)."""
        return self._analyzer.analyze(text)

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        rows = self.search_rows(queries, topk)
        return [
            [SearchHit(passage=p, score=s) for p, (_, s) in zip(self._passages(r), r, strict=True)]
            for r in rows
        ]

    def _passages(self, ranked: list[tuple[int, float]]) -> list[Passage]:
        return self.store.many([row for row, _ in ranked])

    def search_rows(self, queries: Sequence[str], topk: int) -> list[list[tuple[int, float]]]:
        """(row, score) pairs per query, best first; an empty list for a query with no indexable term."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not one string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        if self.cfg.threads > 1 and len(queries) > 1:
            return list(self._executor().map(lambda q: self._one(q, topk), queries))
        return [self._one(q, topk) for q in queries]

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.cfg.threads, thread_name_prefix="bm25")
            return self._pool

    def _one(self, query: str, topk: int) -> list[tuple[int, float]]:
        terms = self._analyzer.analyze(query)
        if not terms or self._n == 0:
            return []
        t = self._t
        q = t.Query.boolean_query(
            [
                (t.Occur.Should, t.Query.term_query(self._schema, _FIELD, w, index_option="freq"))
                for w in terms
            ]
        )
        topk = min(topk, self._n)
        # One hit past the cut tells whether a tie straddles it; if so, fetch deeper until the tied group is
        # whole, so it is ordered by row (corpus order), not by tantivy's segment layout.
        limit = min(topk + 1, self._n)
        while True:
            hits = self._searcher.search(q, limit, count=False).hits
            if (
                len(hits) <= topk
                or hits[-1][0] < hits[topk - 1][0]
                or limit >= min(self.cfg.max_tie_scan, self._n)
            ):
                break
            limit = min(limit * 4, max(self.cfg.max_tie_scan, topk + 1), self._n)
        rows = self._searcher.fast_field_values(_ROW, [addr for _, addr in hits])
        if len(hits) <= topk or hits[-1][0] < hits[topk - 1][0]:  # the usual case: only ties inside the top-k
            scores = [s for s, _ in hits[:topk]]
            return sorted(zip(rows[:topk], scores, strict=True), key=lambda rs: (-rs[1], rs[0]))
        scores_np = np.fromiter((s for s, _ in hits), dtype=np.float64, count=len(hits))
        order = np.lexsort((np.asarray(rows), -scores_np))[:topk]  # by score desc, then row asc
        return [(int(rows[i]), float(scores_np[i])) for i in order.tolist()]

    def rows_with_all_terms(self, text: str, limit: int) -> tuple[list[int], int]:
        """Rows of passages holding every indexed term of `text` (best BM25 first, at most `limit`) and how many
        passages hold them; (-1 count) when `text` has no indexed term (stopwords only)."""
        terms = list(dict.fromkeys(self._analyzer.analyze(text)))
        if not terms:
            return [], -1
        if self._n == 0:
            return [], 0
        t = self._t
        must = [(t.Occur.Must, t.Query.term_query(self._schema, _FIELD, w, index_option="freq")) for w in terms]
        result = self._searcher.search(t.Query.boolean_query(must), min(limit, self._n), count=True)
        rows = self._searcher.fast_field_values(_ROW, [addr for _, addr in result.hits])
        return [int(r) for r in rows], int(result.count)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)
