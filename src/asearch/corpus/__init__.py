"""Corpora: documents (source articles), passages (search units) and pages (access units).

`open_corpus(spec)` opens the embedded `wiki10k`, the synthetic `world`, or a jsonl file; chunking
turns documents into passages. Importing this package loads no corpus data.
"""

from asearch.corpus.chunking import ChunkConfig, ChunkStats, chunk_document, iter_passages
from asearch.corpus.formats import read_documents, read_pages, synthetic_url, write_jsonl
from asearch.corpus.sources import CORPUS_SPEC_HELP, JsonlCorpus, open_corpus
from asearch.corpus.types import CorpusSource, Document, Page, Passage
from asearch.corpus.wiki10k import Wiki10kCorpus, wiki_url

__all__ = [
    "CORPUS_SPEC_HELP",
    "ChunkConfig",
    "ChunkStats",
    "CorpusSource",
    "Document",
    "JsonlCorpus",
    "Page",
    "Passage",
    "Wiki10kCorpus",
    "chunk_document",
    "iter_passages",
    "open_corpus",
    "read_documents",
    "read_pages",
    "synthetic_url",
    "wiki_url",
    "write_jsonl",
]
