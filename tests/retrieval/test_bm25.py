"""BM25Retriever on small real tantivy indexes: relevance, the BM25 formula, ties, topk bounds, empty queries."""

from __future__ import annotations

import math
import threading
from pathlib import Path

import pytest

from asearch.corpus.types import Document, Page
from asearch.errors import ConfigError
from asearch.retrieval.bm25 import BM25Config
from asearch.retrieval.index import IndexConfig, build_index, open_index


class ListSource:
    """A CorpusSource over in-test documents (one page per document)."""

    def __init__(self, docs: list[Document], name: str = "test", fingerprint: str = "fp-test"):
        self.docs, self.name, self._fp = docs, name, fingerprint

    def documents(self):
        return iter(self.docs)

    def pages(self):
        return (Page(url=d.url, title=d.title, contents=d.text) for d in self.docs)

    def fingerprint(self) -> str:
        return self._fp


FACTS = [
    ("Eiffel Tower", "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris."),
    ("Mount Everest", "Mount Everest is the highest mountain above sea level, in the Himalayas."),
    ("Great Wall", "The Great Wall of China is a series of fortifications built across northern China."),
    (
        "Photosynthesis",
        "Photosynthesis lets plants convert light energy into chemical energy stored in sugars.",
    ),
    ("Python", "Python is a programming language that emphasises code readability with indentation."),
    ("Amazon River", "The Amazon River in South America is the largest river by discharge volume of water."),
    ("Moon landing", "Apollo 11 landed the first humans on the Moon in July 1969."),
    ("Mitochondria", "Mitochondria are organelles that generate most of the chemical energy of the cell."),
]


def docs_of(pairs: list[tuple[str, str]]) -> list[Document]:
    return [
        Document(id=f"d{i}", title=t, text=x, url=f"https://example.org/{i}")
        for i, (t, x) in enumerate(pairs)
    ]


def build(tmp: Path, docs: list[Document], **bm25: object):
    cfg = IndexConfig.model_validate({"bm25": bm25})
    return open_index(build_index(ListSource(docs), tmp / "index", cfg, progress=False))


@pytest.fixture(scope="module")
def facts_index(tmp_path_factory):
    index = build(tmp_path_factory.mktemp("bm25"), docs_of(FACTS))
    yield index
    index.close()


def test_obviously_relevant_passage_ranks_first(facts_index):
    r = facts_index.retriever("bm25")
    queries = {
        "tallest mountain in the Himalayas": "Mount Everest",
        "lattice tower in Paris": "Eiffel Tower",
        "plants converting light into sugar": "Photosynthesis",  # needs stemming: converting/convert, sugar/sugars
        "which programming language uses indentation": "Python",
        "first humans on the moon": "Moon landing",
    }
    results = r.search(list(queries), 3)
    assert [hits[0].passage.title for hits in results] == list(queries.values())
    for hits in results:
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))


def test_scores_follow_the_bm25_formula(tmp_path):
    # short docs: tantivy's 1-byte fieldnorm is exact for these lengths, so scores match the textbook formula
    texts = ["apple banana apple", "banana cherry", "cherry cherry cherry date", "apple"]
    index = build(tmp_path, docs_of([("", t) for t in texts]), stopwords=None, stemmer=None)
    r = index.retriever("bm25")
    tokens = [
        r.analyze(f'""\n{t}') for t in texts
    ]  # what was indexed: passage contents = quoted title + text
    avgdl = sum(map(len, tokens)) / len(tokens)
    k1, b, n = 1.2, 0.75, len(texts)

    def bm25(query: list[str], doc: list[str]) -> float:
        score = 0.0
        for term in query:
            df = sum(term in d for d in tokens)
            tf = doc.count(term)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(doc) / avgdl)) if tf else 0.0
        return score

    for q in ["apple", "banana cherry", "cherry date apple"]:
        got = {int(h.passage.id[1:].split("#")[0]): h.score for h in r.search([q], 10)[0]}
        want = {i: bm25(q.split(), d) for i, d in enumerate(tokens) if bm25(q.split(), d) > 0}
        assert got.keys() == want.keys(), q
        for i in want:
            assert got[i] == pytest.approx(want[i], rel=1e-4), (q, i)
    index.close()


def test_ties_are_ordered_by_passage_row_across_segments(tmp_path):
    # every third doc is identical, so all of them tie on "zebra"; 4 writer threads spread docs over segments,
    # whose layout (not the corpus order) would decide tantivy's own order for tied hits
    docs = docs_of([("", "zebra grazing here" if i % 3 == 0 else f"filler text {i}") for i in range(300)])
    index = build(tmp_path, docs, threads=4, heap_mb=16)
    r = index.retriever("bm25")
    assert index.manifest["bm25"]["segments"] > 1
    first = r.search_rows(["zebra"], 5)[0]
    assert [row for row, _ in first] == [0, 3, 6, 9, 12]
    assert len({s for _, s in first}) == 1
    assert r.search_rows(["zebra"], 5)[0] == first
    assert [row for row, _ in r.search_rows(["zebra"], 100)[0]] == list(range(0, 300, 3))
    index.close()


def test_topk_bounds(facts_index):
    r = facts_index.retriever("bm25")
    assert len(r.search(["energy"], 1)[0]) == 1
    everything = r.search(["the energy of water"], 1000)[0]  # topk far above corpus size
    assert 1 < len(everything) <= len(facts_index)
    assert len({h.passage.id for h in everything}) == len(everything)
    for bad in (0, -3):
        with pytest.raises(ValueError, match=f"topk must be >= 1, got {bad}"):
            r.search(["energy"], bad)
    with pytest.raises(TypeError):
        r.search("energy", 3)  # a bare string is not a batch


def test_empty_and_stopword_only_queries_return_no_hits_in_place(facts_index):
    r = facts_index.retriever("bm25")
    results = r.search(["", "   ", "the of and", "Everest", "qwertyuiop"], 3)
    assert [len(h) for h in results[:3]] == [0, 0, 0]
    assert results[3][0].passage.title == "Mount Everest"
    assert results[4] == []  # a term the index never saw


def test_query_syntax_is_not_interpreted(facts_index):
    r = facts_index.retriever("bm25")
    hits = r.search(['title:Everest AND "mountain OR (', "-Paris +tower^2 *"], 3)
    assert hits[0][0].passage.title == "Mount Everest"
    assert hits[1][0].passage.title == "Eiffel Tower"


def test_concurrent_searches_from_threads_agree(facts_index):
    r = facts_index.retriever("bm25")
    queries = ["chemical energy", "river water", "tower", "moon"] * 10
    want = [[(h.passage.id, h.score) for h in hits] for hits in r.search(queries, 3)]
    got: dict[int, list] = {}

    def work(i: int) -> None:
        got[i] = [[(h.passage.id, h.score) for h in hits] for hits in r.search(queries, 3)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == want for i in range(4))


def test_config_rejects_what_tantivy_cannot_do():
    with pytest.raises(ValueError, match="k1=1.2"):
        BM25Config(k1=0.9)
    with pytest.raises(ValueError, match="blank"):
        BM25Config(stopwords=["the", " "])
    from asearch.config import load_config

    with pytest.raises(ConfigError, match=r"bm25\.stemmer.*klingon"):
        load_config(IndexConfig, overrides=["bm25.stemmer=klingon"])


def test_custom_stopwords_and_no_stemming(tmp_path):
    docs = docs_of([("", "running fast"), ("", "run slowly"), ("", "zorp the bird")])
    index = build(tmp_path, docs, stemmer=None, stopwords=["zorp"])
    r = index.retriever("bm25")
    assert [h.passage.id for h in r.search(["run"], 5)[0]] == ["d1#0"]  # no stemming: running != run
    assert r.search(["zorp"], 5)[0] == []
    assert [h.passage.id for h in r.search(["the"], 5)[0]] == ["d2#0"]  # "the" is not a stopword here
    index.close()
