"""Split documents into fixed-size word windows (search passages) that keep their title and url.

Streams: `iter_passages` holds one document at a time, whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from pydantic import Field, model_validator

from asearch.config import Config
from asearch.corpus.types import CorpusSource, Document, Passage


class ChunkConfig(Config):
    """How documents are cut into passages. Words are whitespace-separated tokens."""

    words: int = Field(100, gt=0, description="Words per passage (wiki-18 uses 100).")
    overlap: int = Field(
        0,
        ge=0,
        description="Words each passage repeats from the end of the previous one (0 <= overlap < words).",
    )
    min_tail_words: int = Field(
        0,
        ge=0,
        description=(
            "A last passage adding fewer new words than this is merged into the previous passage "
            "(which then exceeds `words`); 0 keeps every tail as its own passage."
        ),
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> ChunkConfig:
        if self.overlap >= self.words:
            raise ValueError(f"overlap must be smaller than words={self.words}, got overlap={self.overlap}")
        if self.min_tail_words > self.words:
            raise ValueError(
                f"min_tail_words must be at most words={self.words}, got min_tail_words={self.min_tail_words}"
            )
        return self

    @property
    def stride(self) -> int:
        """Words between the starts of consecutive passages."""
        return self.words - self.overlap


@dataclass
class ChunkStats:
    """Counts filled in while `iter_passages` runs (read them after the iterator is exhausted)."""

    documents: int = 0
    passages: int = 0
    words: int = 0
    empty_documents: int = 0
    """Documents with no words: they give no passage, and are counted here rather than dropped silently."""


def chunk_spans(n_words: int, cfg: ChunkConfig) -> list[tuple[int, int]]:
    """[start, end) word spans of the passages of an `n_words`-word text.

    Spans start every `stride` words; the last one ends at `n_words` and is the first to reach it,
    so no passage consists of overlap only. A short text gives one span; an empty one none.
    """
    spans: list[tuple[int, int]] = []
    start = 0
    while start < n_words:
        end = min(start + cfg.words, n_words)
        spans.append((start, end))
        if end == n_words:
            break
        start += cfg.stride
    if len(spans) >= 2 and cfg.min_tail_words:
        new_words = spans[-1][1] - spans[-2][1]
        if new_words < cfg.min_tail_words:
            spans[-2:] = [(spans[-2][0], n_words)]
    return spans


def chunk_document(doc: Document, cfg: ChunkConfig | None = None) -> Iterator[Passage]:
    """Passages `{doc.id}#0`, `{doc.id}#1`, ... of `doc`, whitespace-normalised, with its title and url."""
    return _chunk_words(doc, doc.text.split(), cfg or ChunkConfig())


def _chunk_words(doc: Document, words: list[str], cfg: ChunkConfig) -> Iterator[Passage]:
    for k, (start, end) in enumerate(chunk_spans(len(words), cfg)):
        yield Passage(id=f"{doc.id}#{k}", title=doc.title, text=" ".join(words[start:end]), url=doc.url)


def iter_passages(
    source: CorpusSource | Iterable[Document],
    cfg: ChunkConfig | None = None,
    stats: ChunkStats | None = None,
) -> Iterator[Passage]:
    """Stream the passages of every document of `source` (a CorpusSource or any iterable of Documents).

    Pass a `ChunkStats` to have documents, passages, words and empty documents counted on the way.
    """
    cfg = cfg or ChunkConfig()
    documents: Iterable[Document] = source.documents() if hasattr(source, "documents") else source  # type: ignore[union-attr]
    for doc in documents:
        words = doc.text.split()
        if stats is not None:
            stats.documents += 1
            stats.words += len(words)
            stats.empty_documents += not words
        for passage in _chunk_words(doc, words, cfg):
            if stats is not None:
                stats.passages += 1
            yield passage
