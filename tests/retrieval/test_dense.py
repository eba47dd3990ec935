"""Dense (real MiniLM, 1 thread) and hybrid retrieval: semantic matches, faiss index types, RRF math, model checks."""

from __future__ import annotations

import numpy as np
import pytest

from asearch.corpus.types import Document, Page
from asearch.errors import IndexError_
from asearch.retrieval.dense import DenseConfig, _make_index, resolve_model
from asearch.retrieval.hybrid import HybridConfig, HybridRetriever, rrf_fuse
from asearch.retrieval.index import IndexConfig, build_index, open_index

torch = pytest.importorskip("torch")
pytest.importorskip("sentence_transformers")
pytest.importorskip("faiss")
torch.set_num_threads(1)


class ListSource:
    def __init__(self, docs: list[Document]):
        self.docs, self.name = docs, "dense-test"

    def documents(self):
        return iter(self.docs)

    def pages(self):
        return (Page(url=d.url, title=d.title, contents=d.text) for d in self.docs)

    def fingerprint(self) -> str:
        return "fp-dense"


SENTENCES = [
    "The cat sat on the mat all afternoon.",
    "Stock markets fell sharply after the interest rate announcement.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Heavy rain caused flooding in several coastal towns.",
    "The striker scored twice in the second half of the match.",
    "Astronomers discovered a new exoplanet orbiting a distant star.",
    "The violinist performed a concerto with the symphony orchestra.",
    "Doctors recommend regular exercise to lower blood pressure.",
    "The programmer fixed a bug that crashed the web server.",
    "Volcanic ash grounded flights across northern Europe.",
    "The children built a sandcastle on the beach.",
    "Electric cars are becoming cheaper to manufacture.",
]
DOCS = [Document(f"s{i}", "", s, f"https://dense.example/{i}") for i, s in enumerate(SENTENCES)]
DENSE = {"threads": 1, "batch_size": 16}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    cfg = IndexConfig.model_validate({"dense": DENSE})
    out = build_index(ListSource(DOCS), tmp_path_factory.mktemp("dense") / "idx", cfg, progress=False)
    ix = open_index(out)
    yield ix
    ix.close()


def test_dense_finds_the_paraphrase_that_bm25_cannot(index):
    queries = {
        "a kitten lying on a rug": "s0",  # no word in common with "The cat sat on the mat"
        "soccer player got two goals": "s4",
        "musician playing classical music": "s6",
        "physicians advise workouts for hypertension": "s7",
    }
    dense = index.retriever("dense").search(list(queries), 3)
    assert [hits[0].passage.id.split("#")[0] for hits in dense] == list(queries.values())
    for hits in dense:
        assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
        assert -1.0 <= hits[-1].score <= hits[0].score <= 1.0 + 1e-5  # normalised: inner product = cosine
    assert index.retriever("bm25").search(["a kitten lying on a rug"], 3) == [[]]


def test_dense_manifest_and_empty_queries(index):
    d = index.manifest["dense"]
    assert d["model"] == "default" and d["dim"] == 384 and d["ntotal"] == len(SENTENCES)
    assert d["model_path"] == resolve_model("default") and d["index_type"] == "flat"
    r = index.retriever("dense")
    out = r.search(["", "stock market crash", "   "], 2)
    assert out[0] == [] and out[2] == [] and out[1][0].passage.id == "s1#0"
    assert len(r.search(["weather"], 100)[0]) == len(SENTENCES)  # topk clamps to the corpus
    with pytest.raises(ValueError, match="topk must be >= 1"):
        r.search(["x"], 0)


def test_hybrid_fuses_both_rankings(index):
    hybrid = index.retriever("hybrid")
    hits = hybrid.search(["kitten on a rug", "volcanic ash flights"], 3)
    assert hits[0][0].passage.id == "s0#0"  # dense alone finds it; fusion keeps it on top
    assert hits[1][0].passage.id == "s9#0"  # both rankers agree
    k = index.config.hybrid.k
    assert hits[1][0].score == pytest.approx(2 / (k + 1))  # rank 1 in both, weights 1 + 1


def test_dense_model_mismatch_is_refused(index):
    with pytest.raises(IndexError_, match="built with model 'default'.*'intfloat/e5-base-v2'.*Rebuild it"):
        open_index(index.path, expect_dense_model="intfloat/e5-base-v2")
    open_index(index.path, expect_dense_model="default").close()


def test_ivfpq_on_a_tiny_corpus_falls_back_to_flat_with_a_note(tmp_path):
    cfg = IndexConfig.model_validate({"dense": {**DENSE, "index_type": "ivfpq"}})
    out = build_index(ListSource(DOCS[:6]), tmp_path / "idx", cfg, progress=False)
    with open_index(out) as ix:
        d = ix.manifest["dense"]
        assert d["index_type"] == "flat" and "needs >= 256 passages" in d["notes"][0]
        assert ix.retriever("dense").search(["a cat on a mat"], 1)[0][0].passage.id == "s0#0"


def test_faiss_index_types_on_random_vectors():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    hnsw, facts = _make_index(DenseConfig(index_type="hnsw", hnsw_m=8), 64, x)
    hnsw.add(x)
    assert facts["index_type"] == "hnsw" and (hnsw.search(x[:5], 1)[1][:, 0] == np.arange(5)).all()
    ivf, facts = _make_index(DenseConfig(index_type="ivfpq", ivf_nlist=1024, pq_m=16, ivf_nprobe=8), 64, x)
    assert facts["nlist"] == 1000 // 39 and "clamped 1024 -> 25" in facts["notes"][0]
    ivf.add(x)
    ivf.nprobe = 25
    assert (ivf.search(x[:20], 5)[1] == np.arange(20)[:, None]).any(axis=1).mean() >= 0.9  # PQ is lossy
    with pytest.raises(IndexError_, match="pq_m=10 must divide the embedding dimension 64"):
        _make_index(DenseConfig(index_type="ivfpq", pq_m=10), 64, x)


def test_rrf_math_on_a_hand_computed_example():
    # bm25 ranks [7, 3, 5], dense ranks [3, 9, 7]; k = 60
    fused = dict(rrf_fuse([[7, 3, 5], [3, 9, 7]], [1.0, 1.0], k=60))
    assert fused[3] == pytest.approx(1 / 62 + 1 / 61)
    assert fused[7] == pytest.approx(1 / 61 + 1 / 63)
    assert fused[9] == pytest.approx(1 / 62) and fused[5] == pytest.approx(1 / 63)
    assert [r for r, _ in rrf_fuse([[7, 3, 5], [3, 9, 7]], [1.0, 1.0], k=60)] == [3, 7, 9, 5]
    # dense weighted x2: 3 = 1/62 + 2/61, 7 = 1/61 + 2/63, 9 = 2/62, 5 = 1/63
    weighted = rrf_fuse([[7, 3, 5], [3, 9, 7]], [1.0, 2.0], k=60)
    assert [r for r, _ in weighted] == [3, 7, 9, 5]
    assert dict(weighted)[9] == pytest.approx(2 / 62)
    # ties go to the lower row id; a zero weight removes a ranker
    assert rrf_fuse([[4], [2]], [1.0, 1.0], k=10) == [(2, 1 / 11), (4, 1 / 11)]
    assert [r for r, _ in rrf_fuse([[1, 2], [2, 1]], [1.0, 0.0])] == [1, 2]
    with pytest.raises(ValueError, match="2 rankings but 1 weights"):
        rrf_fuse([[1], [2]], [1.0])


class _FixedRanker:
    def __init__(self, name: str, ranking: list[int]):
        self.name, self.ranking = name, ranking
        self.asked: list[int] = []

    def search_rows(self, queries, topk):
        self.asked.append(topk)
        return [[(r, 1.0) for r in self.ranking[:topk]] for _ in queries]


def test_hybrid_retriever_depth_and_weights():
    bm25, dense = _FixedRanker("bm25", [0, 1, 2, 3]), _FixedRanker("dense", [3, 2, 1, 0])
    h = HybridRetriever(bm25, dense, store=None, cfg=HybridConfig(k=1, depth=2, dense_weight=0.5))  # type: ignore[arg-type]
    (ranked,) = h.search_rows(["q"], 3)
    assert bm25.asked == [3] and dense.asked == [3]  # depth is raised to topk
    # bm25 ranks 0,1,2 -> 1/2, 1/3, 1/4; dense ranks 3,2,1 -> .5/2, .5/3, .5/4
    assert ranked == [
        (0, pytest.approx(0.5)),
        (1, pytest.approx(1 / 3 + 0.125)),
        (2, pytest.approx(0.25 + 0.5 / 3)),
    ]
