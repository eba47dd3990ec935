"""`asearch index import`: a peer's flat faiss index plus its corpus jsonl -> an asearch index directory whose
dense part is compressed to a memory budget.

Search-R1 and ASearcher ship `e5_Flat.index` (a faiss `IndexFlatIP` written by `faiss.write_index`; vector i
belongs to line i of the corpus file) beside `wiki-18.jsonl` / `wiki_corpus.jsonl` ({"id", "contents"} lines,
ASearcher's with a "url") and, for ASearcher, `wiki_webpages.jsonl` ({"url", "contents"} pages). The flat file
is read a block at a time from the offset its header gives, never whole: a training sample, then batches to
add, then one streaming pass for the exact top-k that recall is measured against.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asearch.corpus.chunking import ChunkConfig
from asearch.corpus.formats import read_pages
from asearch.corpus.sources import JsonlCorpus
from asearch.corpus.types import Document, Page
from asearch.errors import IndexError_
from asearch.retrieval.dense import IVF_KINDS, DenseConfig, Encoder, compressed_index
from asearch.retrieval.flatfile import FlatVectors, exact_topk, read_flat_header, rerank, write_flat_file

__all__ = ["FlatVectors", "exact_topk", "import_flat_index", "read_flat_header", "rerank", "write_flat_file"]

E5_MODEL = "intfloat/e5-base-v2"  # the query encoder of Search-R1's and ASearcher's e5_Flat.index
KINDS = ("flat", "ivfsq8", "opq_ivfpq", "ivfpq")  # best recall first; the plan takes the first that fits the budget


# --------------------------------------------------------------------------- the memory plan


@dataclass(frozen=True)
class CompressionPlan:
    """The dense index an import builds: kind, IVF cells, PQ bytes per vector, and its estimated memory."""

    kind: str
    nlist: int
    pq_m: int
    bytes: int

    def label(self) -> str:
        if self.kind == "flat":
            return "flat (exact)"
        extra = f", m={self.pq_m} bytes/vector" if self.kind in ("ivfpq", "opq_ivfpq") else ""
        return f"{self.kind} (nlist={self.nlist}{extra})"


def index_bytes(kind: str, n: int, dim: int, nlist: int, pq_m: int) -> int:
    """Memory of a faiss index of `kind` holding n vectors: codes + 8-byte ids + coarse centroids (+ OPQ, PQ)."""
    if kind == "flat":
        return n * dim * 4
    coarse = nlist * dim * 4
    if kind == "ivfsq8":
        return n * (dim + 8) + coarse + 2 * dim * 4
    rotation = dim * dim * 4 if kind == "opq_ivfpq" else 0
    return n * (pq_m + 8) + coarse + rotation + 256 * dim * 4


def default_nlist(n: int, train_size: int) -> int:
    """About 4 sqrt(n) cells, a power of two, at most one per 39 training vectors (faiss k-means' minimum)."""
    cap = max(1, min(n, train_size) // 39)
    want = max(1, min(int(4 * math.sqrt(max(n, 1))), cap))
    return 1 << (want.bit_length() - 1)


def pq_choices(dim: int) -> list[int]:
    """PQ sub-quantizer counts (bytes per vector) that divide `dim`, largest first."""
    return [m for m in (256, 192, 128, 96, 64, 48, 32, 24, 16, 8) if m < dim and dim % m == 0]


def plan_compression(
    n: int, dim: int, budget_bytes: int, nlist: int, kind: str | None = None, train_size: int = 100_000
) -> CompressionPlan:
    """The most accurate index that fits `budget_bytes` (or the best-fitting variant of `kind`)."""
    candidates = [CompressionPlan("flat", 0, 0, index_bytes("flat", n, dim, 0, 0))]
    candidates.append(CompressionPlan("ivfsq8", nlist, 0, index_bytes("ivfsq8", n, dim, nlist, 0)))
    # OPQ learns a dim x dim rotation: faiss aborts the process when given fewer training vectors than dims
    opq_ok = min(n, train_size) >= dim
    for m in pq_choices(dim):  # plain ivfpq after OPQ at each m: the rotation's 4*dim^2 bytes dominate small indexes
        for pq_kind in ("opq_ivfpq", "ivfpq") if opq_ok else ("ivfpq",):
            candidates.append(CompressionPlan(pq_kind, nlist, m, index_bytes(pq_kind, n, dim, nlist, m)))
    if kind == "opq_ivfpq" and not opq_ok:
        raise IndexError_(f"opq_ivfpq needs at least {dim} training vectors (its rotation is {dim} x {dim})")
    if kind is not None:
        if kind not in KINDS:
            raise IndexError_(f"index kind {kind!r}: choose one of {', '.join(KINDS)}")
        candidates = [c for c in candidates if c.kind == kind]
    for plan in candidates:
        if plan.bytes <= budget_bytes:
            return plan
    smallest = min(candidates, key=lambda c: c.bytes)
    raise IndexError_(
        f"no dense index of {n:,} vectors x {dim} dims fits {budget_bytes / 2**20:,.1f} MiB: the smallest, "
        f"{smallest.label()}, needs {smallest.bytes / 2**20:,.1f} MiB; raise --memory-gb"
    )


# --------------------------------------------------------------------------- build and measure


def build_compressed(
    flat: FlatVectors, plan: CompressionPlan, *, train_size: int, batch: int = 16_384, seed: int = 0
) -> tuple[Any, dict[str, float]]:
    """Train `plan`'s index on a seeded sample of the flat rows, then add every row in batches."""
    index = compressed_index(plan.kind, flat.dim, plan.nlist, plan.pq_m or 8)
    t0 = time.perf_counter()
    if not index.is_trained:
        rng = np.random.default_rng(seed)  # seeded: the same flat file trains the same quantizers
        rows = np.sort(rng.choice(flat.ntotal, size=min(flat.ntotal, train_size), replace=False))
        index.train(flat.take(rows))
    t1 = time.perf_counter()
    for _, block in flat.blocks(batch):
        index.add(block)
    return index, {"train_seconds": round(t1 - t0, 2), "add_seconds": round(time.perf_counter() - t1, 2)}


def recall_against_flat(
    flat: FlatVectors,
    index: Any,
    queries: np.ndarray,
    k: int,
    self_rows: np.ndarray | None = None,
    rerank_candidates: int | None = None,
) -> float:
    """Mean share of the exact top-k (from the flat file) that `index` also returns in its top-k.

    `self_rows`: queries that are stored vectors; each one's own row is dropped from both lists.
    `rerank_candidates`: the index's top that many, re-scored from the flat file (dense.rerank_file)."""
    extra = 1 if self_rows is not None else 0
    truth = exact_topk(flat, queries, k + extra)
    queries = np.ascontiguousarray(queries, dtype=np.float32)
    if rerank_candidates:
        _, candidates = index.search(queries, max(rerank_candidates, k + extra))
        got = np.array([[r for r, _ in pairs] for pairs in rerank(flat, queries, candidates, k + extra)])
    else:
        _, got = index.search(queries, k + extra)
    hits = 0
    for i in range(len(queries)):
        t, g = truth[i].tolist(), got[i].tolist()
        if self_rows is not None:
            own = int(self_rows[i])
            t = [r for r in t if r != own][:k]
            g = [r for r in g if r != own][:k]
        hits += len(set(t[:k]) & set(g[:k]))
    return hits / (k * max(1, len(queries)))


# --------------------------------------------------------------------------- the import


@dataclass
class ImportSettings:
    """What `import_flat_index` is asked to do (the CLI options of `asearch index import`)."""

    memory_gb: float
    query_model: str = E5_MODEL
    query_prefix: str = "query: "
    passage_prefix: str = "passage: "
    kind: str | None = None  # None: the best kind that fits memory_gb
    nlist: int | None = None  # None: default_nlist
    nprobe: int = 32
    train_size: int = 100_000
    recall_k: int = 10
    recall_queries: int = 200
    queries: list[str] | None = None  # question texts, embedded with query_model; None: stored vectors
    threads: int = 1
    batch: int = 16_384
    device: str = "cpu"  # where the server runs the query encoder (cpu, cuda)
    rerank: bool = False  # serve with the flat file's exact vectors re-scoring the candidates (dense.rerank_file)
    rerank_candidates: int = 100


@dataclass
class ImportResult:
    path: Path
    plan: CompressionPlan
    recall: float
    recall_on: str
    recall_reranked: float | None
    flat_bytes: int
    index_file_bytes: int
    facts: dict[str, Any] = field(default_factory=dict)


class _ImportedCorpus:
    """The peer's corpus file as a CorpusSource: one document per line, pages from it or a pages file."""

    def __init__(self, corpus: Path, pages: Path | None):
        self._corpus = JsonlCorpus(corpus)
        self._pages = pages
        self.name = self._corpus.name
        self.path = self._corpus.path

    def documents(self) -> Iterator[Document]:
        return self._corpus.documents()

    def pages(self) -> Iterator[Page]:
        return read_pages(self._pages) if self._pages is not None else self._corpus.pages()

    def document_lines(self, doc_id: str) -> list[int]:
        return self._corpus.document_lines(doc_id)

    def fingerprint(self) -> str:
        fp = self._corpus.fingerprint()
        return fp if self._pages is None else f"{fp}+pages:{JsonlCorpus(self._pages).fingerprint()}"


def _recall_queries(flat: FlatVectors, s: ImportSettings) -> tuple[np.ndarray, np.ndarray | None, str]:
    """Queries for the recall check: the given questions embedded by the query model, else stored vectors."""
    if s.queries:
        enc = Encoder(DenseConfig(model=s.query_model, query_prefix=s.query_prefix, threads=s.threads))
        if enc.dim != flat.dim:
            raise IndexError_(
                f"query model {s.query_model!r} embeds in {enc.dim} dims, the flat index holds {flat.dim}: "
                "pass the model the index was built with (--query-model)"
            )
        return enc.queries(s.queries), None, f"{len(s.queries)} questions embedded by {s.query_model}"
    rows = np.sort(np.random.default_rng(1).choice(flat.ntotal, min(flat.ntotal, s.recall_queries), replace=False))
    return flat.take(rows), rows, f"{len(rows)} stored vectors as queries (each one's own row left out)"


def dense_importer(flat: FlatVectors, s: ImportSettings, say: Callable[[str], None]) -> tuple[Callable, dict]:
    """The `dense_builder` for build_index: compress, measure recall, write dense/index.faiss."""
    import faiss

    faiss.omp_set_num_threads(s.threads)
    nlist = s.nlist or default_nlist(flat.ntotal, s.train_size)
    plan = plan_compression(flat.ntotal, flat.dim, int(s.memory_gb * 2**30), nlist, s.kind, s.train_size)
    report: dict[str, Any] = {"plan": plan}

    def build(dense_dir: Path, passages: int) -> dict[str, Any]:
        if passages != flat.ntotal:
            raise IndexError_(
                f"the corpus gives {passages:,} passages but {flat.path} holds {flat.ntotal:,} vectors: vector i "
                "must be line i of the corpus file (is it the corpus the index was built from?)"
            )
        say(f"dense: {plan.label()}, ~{plan.bytes / 2**20:,.1f} MiB in memory against {flat.nbytes / 2**20:,.1f} MiB flat")
        index, timings = build_compressed(flat, plan, train_size=s.train_size, batch=s.batch)
        if plan.kind in IVF_KINDS:
            faiss.extract_index_ivf(index).nprobe = s.nprobe
        queries, self_rows, on = _recall_queries(flat, s)
        t0 = time.perf_counter()
        recall = recall_against_flat(flat, index, queries, s.recall_k, self_rows)
        reranked = (
            recall_against_flat(flat, index, queries, s.recall_k, self_rows, s.rerank_candidates) if s.rerank else None
        )
        report.update(recall=recall, recall_on=on, recall_reranked=reranked)
        dense_dir.mkdir(parents=True, exist_ok=True)
        faiss.write_index(index, str(dense_dir / "index.faiss"))
        return {
            "index_type": plan.kind,
            "notes": [f"imported from {flat.path} ({flat.ntotal:,} x {flat.dim} flat, {flat.nbytes:,} bytes)"],
            "model": s.query_model,
            "model_path": s.query_model,
            "dim": flat.dim,
            "ntotal": int(index.ntotal),
            "nlist": plan.nlist,
            "pq_m": plan.pq_m,
            "memory_budget_bytes": int(s.memory_gb * 2**30),
            "memory_estimate_bytes": plan.bytes,
            f"recall_at_{s.recall_k}_vs_flat": round(recall, 4),
            f"recall_at_{s.recall_k}_reranked": None if reranked is None else round(reranked, 4),
            "recall_queries": on,
            "recall_seconds": round(time.perf_counter() - t0, 2),
            **timings,
        }

    return build, report


def _count_lines(path: Path) -> int:
    """Lines of a text file, counted by block (a last line without a newline counts)."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def import_flat_index(
    flat_path: str | Path,
    corpus_path: str | Path,
    out_dir: str | Path,
    settings: ImportSettings,
    *,
    pages_path: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = False,
    build_command: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> ImportResult:
    """Write an asearch index directory from a flat faiss index and the corpus whose line i is its vector i.

    Passages are the corpus lines as they are (one each, never re-chunked: row i must stay vector i), with BM25
    and pages as `build_index` writes them; the dense part is the plan's index for `settings.memory_gb`.
    """
    from asearch.retrieval.index import IndexConfig, build_index

    flat = read_flat_header(flat_path)
    lines = _count_lines(Path(corpus_path))
    if lines < flat.ntotal:  # seconds, before the BM25 build that a mismatch would waste (an hour at 21M)
        raise IndexError_(
            f"{corpus_path} has {lines:,} lines but {flat.path} holds {flat.ntotal:,} vectors: vector i must be line i "
            "of the corpus file (is it the corpus the index was built from?)"
        )
    source = _ImportedCorpus(Path(corpus_path), Path(pages_path) if pages_path else None)
    builder, report = dense_importer(flat, settings, say)
    plan: CompressionPlan = report["plan"]
    dense_cfg = DenseConfig(
        model=settings.query_model,
        query_prefix=settings.query_prefix,
        passage_prefix=settings.passage_prefix,
        index_type=plan.kind,  # type: ignore[arg-type]
        ivf_nlist=max(1, plan.nlist),
        ivf_nprobe=settings.nprobe,
        pq_m=plan.pq_m or DenseConfig().pq_m,
        train_size=max(settings.train_size, 256),
        threads=settings.threads,
        device=settings.device,
        rerank_file=str(flat.path.absolute()) if settings.rerank else None,
        rerank_candidates=settings.rerank_candidates,
    )
    cfg = IndexConfig(chunk=ChunkConfig(words=1_000_000), dense=dense_cfg)  # one passage per line
    path = build_index(
        source, out_dir, cfg, progress=progress, overwrite=overwrite, build_command=build_command,
        dense_builder=builder,
    )  # fmt: skip
    return ImportResult(
        path=path,
        plan=plan,
        recall=report["recall"],
        recall_on=report["recall_on"],
        recall_reranked=report["recall_reranked"],
        flat_bytes=flat.nbytes,
        index_file_bytes=(path / "dense" / "index.faiss").stat().st_size,
    )
