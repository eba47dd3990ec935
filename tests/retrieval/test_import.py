"""`asearch index import`: a flat faiss index in the peers' format (Search-R1's e5_Flat.index + wiki-18.jsonl)
becomes an asearch index with a dense part compressed to a memory budget, recall@10 against flat printed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")

from asearch.errors import IndexError_  # noqa: E402
from asearch.retrieval.importer import (  # noqa: E402
    ImportSettings,
    exact_topk,
    import_flat_index,
    plan_compression,
    read_flat_header,
    write_flat_file,
)
from asearch.retrieval.index import open_index  # noqa: E402


def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(32, dim))
    x = (centres[rng.integers(32, size=n)] + 0.6 * rng.normal(size=(n, dim))).astype("f4")
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def wiki18_lines(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": str(i), "contents": f'"Title {i}"\nword{i} passage number {i}'}) + "\n")
    return path


def test_flat_file_is_read_by_block_as_faiss_writes_it(tmp_path):
    x = clustered(1000, 16)
    ref = faiss.IndexFlatIP(16)
    ref.add(x)
    faiss.write_index(ref, str(tmp_path / "e5_Flat.index"))
    mine = write_flat_file(tmp_path / "mine.index", 16, 1000, [x[:300], x[300:]])
    assert mine.read_bytes() == (tmp_path / "e5_Flat.index").read_bytes()  # the peers' format, byte for byte
    flat = read_flat_header(mine)
    assert (flat.dim, flat.ntotal) == (16, 1000)
    assert np.array_equal(flat.rows(998, 1005), x[998:])
    assert np.array_equal(flat.take(np.array([3, 999, 0])), x[[3, 999, 0]])
    # the streaming exact search agrees with faiss's own flat search
    _, want = ref.search(x[:20], 5)
    assert np.array_equal(exact_topk(flat, x[:20], 5, batch=128), want)


def test_other_index_files_are_refused_with_the_reason(tmp_path):
    x = clustered(2000, 16)
    ivf = faiss.IndexIVFFlat(faiss.IndexFlatIP(16), 16, 8, faiss.METRIC_INNER_PRODUCT)
    ivf.train(x)
    faiss.write_index(ivf, str(tmp_path / "ivf.index"))
    with pytest.raises(IndexError_, match="not a flat one"):
        read_flat_header(tmp_path / "ivf.index")
    full = write_flat_file(tmp_path / "f.index", 16, 2000, [x])
    cut = tmp_path / "cut.index"
    cut.write_bytes(full.read_bytes()[:-64])
    with pytest.raises(IndexError_, match="truncated"):
        read_flat_header(cut)


def test_the_plan_is_the_most_accurate_index_that_fits_the_budget():
    n, dim = 21_000_000, 768
    assert plan_compression(n, dim, 80 << 30, 4096).kind == "flat"  # 64.5 GB of float32 fits 80 GB
    assert plan_compression(n, dim, 20 << 30, 4096).kind == "ivfsq8"  # 16.3 GB
    p8 = plan_compression(n, dim, 8 << 30, 4096)
    p2 = plan_compression(n, dim, 2 << 30, 4096)
    assert (p8.kind, p8.pq_m) == ("opq_ivfpq", 256) and p8.bytes <= 8 << 30
    assert (p2.kind, p2.pq_m) == ("opq_ivfpq", 64) and p2.bytes <= 2 << 30
    with pytest.raises(IndexError_, match="raise --memory-gb"):
        plan_compression(n, dim, 100 << 20, 4096)
    # 1,500 MiniLM vectors: OPQ's 384 x 384 rotation (590 KB) alone is over 500 KB, plain ivfpq fits
    small = plan_compression(1500, 384, 500_000, 32)
    assert (small.kind, small.pq_m) == ("ivfpq", 24) and small.bytes <= 500_000  # + 393 KB of PQ centroids


def test_import_writes_an_index_that_answers_like_the_flat_one(tmp_path):
    n, dim = 3000, 32
    x = clustered(n, dim)
    write_flat_file(tmp_path / "e5_Flat.index", dim, n, [x])
    corpus = wiki18_lines(tmp_path / "wiki-18.jsonl", n)
    settings = ImportSettings(memory_gb=0.0002, query_model="default", query_prefix="", passage_prefix="")
    result = import_flat_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "idx", settings)
    assert result.plan.kind == "ivfsq8" and result.index_file_bytes < result.flat_bytes / 2
    assert result.recall > 0.9, result.recall
    index = open_index(result.path)
    assert len(index) == n and index.passage(7).text == "word7 passage number 7"  # row i = line i
    assert index.passage(7).title == "Title 7" and index.passage("7#0").id == "7#0"
    dense = index.manifest["dense"]
    assert dense["index_type"] == "ivfsq8" and dense["recall_at_10_vs_flat"] == round(result.recall, 4)
    assert index.retriever("bm25").search(["word1234"], 1)[0][0].passage.id == "1234#0"
    # the compressed index, read back memory-mapped, returns the flat index's nearest row for a stored vector
    compressed = faiss.read_index(str(result.path / "dense" / "index.faiss"), faiss.IO_FLAG_MMAP)
    faiss.extract_index_ivf(compressed).nprobe = 32
    _, rows = compressed.search(x[[42]], 1)
    assert rows[0][0] == 42
    index.close()


def test_a_corpus_that_does_not_match_the_vectors_is_refused_and_nothing_is_left(tmp_path):
    write_flat_file(tmp_path / "e5_Flat.index", 8, 300, [clustered(300, 8)])
    corpus = wiki18_lines(tmp_path / "wiki-18.jsonl", 299)
    settings = ImportSettings(memory_gb=1.0, query_model="default")
    with pytest.raises(IndexError_, match="299 lines but .* 300 vectors"):
        import_flat_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "idx", settings)
    corpus = wiki18_lines(tmp_path / "wiki-18.jsonl", 301)  # enough lines: refused after the passages are read
    with pytest.raises(IndexError_, match="301 passages but .* 300 vectors"):
        import_flat_index(tmp_path / "e5_Flat.index", corpus, tmp_path / "idx", settings)
    assert not (tmp_path / "idx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".idx")]


@pytest.fixture(scope="module")
def minilm_flat(tmp_path_factory):
    """wiki10k passages in wiki-18 form and their bundled-MiniLM embeddings in a Search-R1-format flat file."""
    pytest.importorskip("sentence_transformers")
    from asearch.corpus import open_corpus
    from asearch.corpus.chunking import iter_passages
    from asearch.retrieval.dense import DenseConfig, Encoder

    d = tmp_path_factory.mktemp("minilm")
    passages = []
    for p in iter_passages(open_corpus("wiki10k")):
        passages.append(p)
        if len(passages) == 400:  # OPQ trains a 384 x 384 rotation: at least 384 vectors
            break
    with (d / "wiki-18.jsonl").open("w") as f:
        for i, p in enumerate(passages):
            f.write(json.dumps({"id": str(i), "contents": p.contents}) + "\n")
    # 32 tokens a passage: real MiniLM vectors at a quarter of the cost of whole passages
    vectors = Encoder(DenseConfig(batch_size=64, max_seq_length=32)).passages([p.contents for p in passages])
    write_flat_file(d / "e5_Flat.index", vectors.shape[1], len(vectors), [vectors])
    return d


def test_cli_import_with_real_embeddings_prints_recall_and_serves_dense(minilm_flat, tmp_path):
    from typer.testing import CliRunner

    from asearch.cli.index import app

    out = tmp_path / "idx"
    args = [
        "import", str(minilm_flat / "e5_Flat.index"), "--corpus", str(minilm_flat / "wiki-18.jsonl"),
        "--out", str(out), "--memory-gb", "0.00095", "--kind", "opq_ivfpq", "--query-model", "default", "--query-prefix", "",
        "--passage-prefix", "", "--queries", "wiki10k:n=50", "--train-size", "400", "--rerank",
    ]  # fmt: skip
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    # 0.00095 GB: the 384 x 384 rotation and the PQ tables take most of it, 48 code bytes a vector fit
    # (flat, 600 KB, would fit too: at 400 vectors compression only costs; --kind asks for it anyway)
    assert "opq_ivfpq (nlist=8, m=48 bytes/vector)" in text and "50 questions embedded by default" in text
    recall = float(re.search(r"recall@10 against flat: ([\d.]+)", text).group(1))
    reranked = float(re.search(r"recall@10 with the top 100 re-scored from .*?: ([\d.]+)", text).group(1))
    assert 0.3 < recall < reranked <= 1.0
    index = open_index(out)
    assert index.manifest["dense"]["index_type"] == "opq_ivfpq"
    assert index.config.dense.rerank_file == str(minilm_flat / "e5_Flat.index")
    dense = index.retriever("dense")
    hit = dense.search(["the passage"], 3)[0]
    assert len(hit) == 3 and all(h.passage.contents.startswith('"') for h in hit)
    # re-scored from the flat file: the scores are the exact inner products of the flat index
    flat = faiss.read_index(str(minilm_flat / "e5_Flat.index"))
    want_scores, want_rows = flat.search(dense.encoder.queries(["the passage"]), 3)
    assert [h.passage.id for h in hit] == [f"{r}#0" for r in want_rows[0]]
    assert [h.score for h in hit] == pytest.approx(want_scores[0].tolist(), abs=1e-5)
    r = CliRunner().invoke(app, args)
    assert r.exit_code != 0 and "already exists" in str(r.exception)
    index.close()


def test_index_build_takes_the_new_kinds_too():
    """dense.index_type=ivfsq8 / opq_ivfpq in `asearch index build` go through the same faiss factory."""
    from asearch.retrieval.dense import DenseConfig, _make_index

    x = clustered(600, 32)
    for kind in ("ivfsq8", "opq_ivfpq"):
        index, facts = _make_index(DenseConfig(index_type=kind, ivf_nlist=8, pq_m=8), 32, x)
        index.add(x)
        faiss.extract_index_ivf(index).nprobe = 8
        assert facts["index_type"] == kind and facts["nlist"] == 8
        assert (index.search(x[:50], 5)[1] == np.arange(50)[:, None]).any(axis=1).mean() >= 0.9
    with pytest.raises(IndexError_, match="opq_ivfpq needs >= 32 training vectors"):
        _make_index(DenseConfig(index_type="opq_ivfpq", train_size=256, pq_m=8), 32, clustered(30, 32))
