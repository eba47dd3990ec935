"""Chunking: config validation, passage ids, overlap, nothing lost, and constant-memory streaming."""

from __future__ import annotations

import itertools
import json
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from asearch.config import load_config
from asearch.corpus import ChunkConfig, ChunkStats, JsonlCorpus, chunk_document, iter_passages
from asearch.corpus.types import Document
from asearch.errors import ConfigError


def _doc(n_words: int, doc_id: str = "d") -> Document:
    return Document(
        id=doc_id, title="Title", text=" ".join(f"w{i}" for i in range(n_words)), url="https://e.org/d"
    )


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [
        ({"words": 10, "overlap": 10}, "got overlap=10"),
        ({"words": 10, "overlap": 25}, "got overlap=25"),
        ({"words": 10, "min_tail_words": 11}, "got min_tail_words=11"),
        ({"words": 0}, "greater than 0"),
        ({"overlap": -1}, "greater than or equal to 0"),
    ],
)
def test_config_rejects_bad_sizes_and_shows_the_value(kwargs, shown):
    with pytest.raises(ValidationError) as err:
        ChunkConfig(**kwargs)
    assert shown in str(err.value)


def test_config_loads_from_overrides_with_the_bad_value_in_the_error():
    assert load_config(ChunkConfig, overrides=["words=50", "overlap=10"]).stride == 40
    with pytest.raises(ConfigError, match="overlap=60"):
        load_config(ChunkConfig, overrides=["words=50", "overlap=60"])


def test_short_document_gives_one_passage_that_keeps_title_and_url():
    (p,) = list(chunk_document(Document("doc-1", "T", "  only   three\nwords ", "https://e.org/x")))
    assert (p.id, p.title, p.text, p.url) == ("doc-1#0", "T", "only three words", "https://e.org/x")


def test_empty_document_gives_no_passage_and_is_counted():
    stats = ChunkStats()
    docs = [_doc(3, "a"), Document("e", "Empty", "   \n ", "u"), _doc(250, "b")]
    passages = list(iter_passages(docs, ChunkConfig(words=100), stats))
    assert [p.id for p in passages] == ["a#0", "b#0", "b#1", "b#2"]
    assert all(p.text for p in passages)
    assert (stats.documents, stats.passages, stats.words, stats.empty_documents) == (3, 4, 253, 1)


def test_exact_multiple_does_not_give_an_empty_or_overlap_only_tail():
    assert [len(p.text.split()) for p in chunk_document(_doc(200), ChunkConfig(words=100))] == [100, 100]
    sizes = [len(p.text.split()) for p in chunk_document(_doc(100), ChunkConfig(words=50, overlap=10))]
    assert sizes == [50, 50, 20]  # starts at 0, 40, 80; the span starting at 80 is the first to reach the end


def test_min_tail_words_merges_a_short_tail_into_the_previous_passage():
    sizes = [
        len(p.text.split()) for p in chunk_document(_doc(105), ChunkConfig(words=100, min_tail_words=10))
    ]
    assert sizes == [105]
    sizes = [
        len(p.text.split()) for p in chunk_document(_doc(115), ChunkConfig(words=100, min_tail_words=10))
    ]
    assert sizes == [100, 15]


@settings(max_examples=200, deadline=None)
@given(
    n_words=st.integers(0, 400),
    words=st.integers(1, 60),
    overlap_frac=st.floats(0, 0.99),
    min_tail_frac=st.floats(0, 1),
)
def test_passages_reproduce_the_document_and_overlap_exactly(n_words, words, overlap_frac, min_tail_frac):
    cfg = ChunkConfig(
        words=words, overlap=int(overlap_frac * words), min_tail_words=int(min_tail_frac * words)
    )
    doc = _doc(n_words)
    passages = list(chunk_document(doc, cfg))
    chunks = [p.text.split() for p in passages]
    assert [p.id for p in passages] == [f"d#{k}" for k in range(len(passages))]
    assert all(chunks), "no empty passage"
    assert bool(passages) == (n_words > 0)
    if n_words <= words:
        assert len(passages) == min(n_words, 1)  # a short document is one passage
    rebuilt = list(chunks[0]) if chunks else []
    for prev, cur in itertools.pairwise(chunks):
        assert cur[: cfg.overlap] == prev[len(prev) - cfg.overlap :]  # each passage repeats `overlap` words
        rebuilt += cur[cfg.overlap :]
    assert rebuilt == doc.text.split()  # nothing lost, nothing duplicated beyond the overlap
    assert all(len(c) <= words for c in chunks[:-1])
    assert not chunks or len(chunks[-1]) <= words + cfg.min_tail_words


def test_iter_passages_is_lazy_over_an_endless_document_stream():
    endless = (_doc(30, f"doc{i}") for i in itertools.count())
    first = list(itertools.islice(iter_passages(endless, ChunkConfig(words=10)), 7))
    assert [p.id for p in first] == ["doc0#0", "doc0#1", "doc0#2", "doc1#0", "doc1#1", "doc1#2", "doc2#0"]


def _peak_bytes_chunking(tmp_path, n_lines: int) -> tuple[int, int]:
    path = tmp_path / f"gen{n_lines}.jsonl"
    with open(path, "w") as f:
        for i in range(n_lines):
            body = " ".join(f"w{i}_{k}" for k in range(12))
            f.write(json.dumps({"id": str(i), "contents": f'"T{i}"\n{body}'}) + "\n")
    tracemalloc.start()
    try:
        n = sum(1 for _ in iter_passages(JsonlCorpus(path), ChunkConfig(words=5)))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 3 * n_lines
    return peak, path.stat().st_size


def test_chunking_a_file_streams_in_constant_memory(tmp_path):
    small_peak, _ = _peak_bytes_chunking(tmp_path, 2_000)
    big_peak, big_size = _peak_bytes_chunking(tmp_path, 20_000)
    assert big_size > 2_500_000
    assert big_peak < 256_000, big_peak  # a 2.9 MB file chunked with ~10 kB of live Python objects
    assert big_peak < 2 * small_peak + 16_000, (small_peak, big_peak)  # 10x the lines, about the same peak
