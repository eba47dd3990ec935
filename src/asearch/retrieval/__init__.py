"""Retrieval: BM25 (tantivy), dense (faiss + sentence-transformers) and hybrid (RRF) over a versioned index dir.

Importing this package loads no engine: tantivy, faiss and torch are imported when an index is built or opened.
"""

from asearch.retrieval.base import PageStore, Retriever, SearchHit
from asearch.retrieval.bm25 import BM25Config, BM25Retriever
from asearch.retrieval.dense import DenseConfig, DenseRetriever
from asearch.retrieval.hybrid import HybridConfig, HybridRetriever, rrf_fuse
from asearch.retrieval.index import FORMAT_VERSION, Index, IndexConfig, build_index, open_index, read_manifest
from asearch.retrieval.store import PageStoreFile, PassageStore

__all__ = [
    "FORMAT_VERSION",
    "BM25Config",
    "BM25Retriever",
    "DenseConfig",
    "DenseRetriever",
    "HybridConfig",
    "HybridRetriever",
    "Index",
    "IndexConfig",
    "PageStore",
    "PageStoreFile",
    "PassageStore",
    "Retriever",
    "SearchHit",
    "build_index",
    "open_index",
    "read_manifest",
    "rrf_fuse",
]
