"""The versioned index directory: `build_index` streams a corpus into it atomically, `open_index` checks and loads it.

Layout (all listed with sizes in manifest.json, which is written last):

    manifest.json                  format version, corpus name + fingerprint, settings, counts, library versions
    passages.{jsonl,offsets.i64,keys.u64,rows.i64}   passage store (row -> passage, passage id -> row)
    pages.{jsonl,offsets.i64,keys.u64,rows.i64}      page store (url -> page)
    bm25/                          tantivy index; documents carry the passage row as a fast field
    dense/index.faiss              optional faiss index; vector i is passage row i

A build writes into a hidden sibling dir and renames it into place at the end, so a killed build never leaves a
directory that opens as an index.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import shutil
import threading
import time
from array import array
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, ValidationError

from asearch.config import Config
from asearch.corpus.chunking import ChunkConfig, ChunkStats, iter_passages
from asearch.corpus.types import CorpusSource, Passage
from asearch.errors import DataFormatError, IndexError_
from asearch.files import atomic_write_json, read_utf8_text
from asearch.retrieval.base import SEARCH_METHODS, Retriever, register_search_method
from asearch.retrieval.bm25 import BM25Config, BM25Retriever, BM25Writer
from asearch.retrieval.dense import DenseConfig
from asearch.retrieval.hybrid import HybridConfig, HybridRetriever
from asearch.retrieval.store import PageStoreFile, PassageStore, RecordWriter, key_hash

FORMAT = "asearch-index"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
Method = str  # a registered search method: bm25, dense, hybrid, ... (asearch.retrieval.base.SEARCH_METHODS)


class IndexConfig(Config):
    """Everything that decides an index's contents (chunking, BM25 analysis, dense model) plus hybrid fusion."""

    chunk: ChunkConfig = Field(
        default_factory=ChunkConfig, description="How documents are cut into passages."
    )
    bm25: BM25Config = Field(default_factory=BM25Config, description="BM25 analysis and indexing.")
    dense: DenseConfig | None = Field(None, description="Dense index settings; null = no dense index.")
    hybrid: HybridConfig = Field(
        default_factory=HybridConfig, description="RRF fusion used by method=hybrid."
    )


# --------------------------------------------------------------------------- build


def rebuild_command(corpus: str, out: str | Path, cfg: IndexConfig | None) -> str:
    """The CLI command that builds this index again (quoted for a POSIX shell)."""
    parts = ["asearch", "index", "build", "--corpus", corpus, "--out", str(out)]
    if cfg is not None and cfg.dense is not None:
        parts += ["--dense", "--dense-model", cfg.dense.model]
    return shlex.join(parts) + (" --force" if Path(out).exists() else "")


def _versions() -> dict[str, str | None]:
    def v(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {
        "asearch": v("asearch"),
        "tantivy": v("tantivy"),
        "faiss": v("faiss-cpu"),
        "sentence-transformers": v("sentence-transformers"),
        "torch": v("torch"),
        "numpy": v("numpy"),
        "python": platform.python_version(),
    }


class _Progress:
    """A rich progress display on stderr (or nothing): one task per build stage."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._p = None

    def __enter__(self) -> _Progress:
        if self.enabled:
            from asearch.progress import progress_bar

            self._p = progress_bar()
            self._p.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._p is not None:
            self._p.__exit__(*exc)

    def task(self, description: str, total: int | None = None) -> Any:
        return self._p.add_task(description, total=total) if self._p is not None else None

    def advance(self, task: Any, n: int) -> None:
        if self._p is not None:
            self._p.advance(task, n)

    def finish(self, task: Any) -> None:
        if self._p is not None:
            t = self._p.tasks[task]
            self._p.update(task, total=t.completed)


def _clean_stale_builds(out: Path) -> None:
    """Remove hidden build dirs of `out` left by killed builds (their pid is gone)."""
    import psutil

    for d in out.parent.glob(f".{out.name}.building-*"):
        pid = d.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(d, ignore_errors=True)


def build_index(
    source: CorpusSource,
    out_dir: str | Path,
    cfg: IndexConfig | None = None,
    *,
    progress: bool = True,
    overwrite: bool = False,
    build_command: str | None = None,
    allow_empty: bool = False,
    dense_builder: Callable[[Path, int], dict[str, Any]] | None = None,
) -> Path:
    """Stream `source` into a new index directory at `out_dir` and return its path.

    Memory stays flat in corpus size apart from what the index keeps (tantivy's writer budget, 16 bytes per
    record for the key indexes, the dense vectors). `overwrite` replaces an existing index only once the new
    one is complete. `build_command` is recorded so a refused index can say how to rebuild it.
    `dense_builder(dense_dir, passages)` writes the dense part instead of embedding with `cfg.dense` (an
    imported index, `asearch.retrieval.importer`) and returns the manifest's dense facts.
    Refused (DataFormatError, nothing written): two documents with one id (search hits would share a
    passage id), and a corpus without passages unless `allow_empty`.
    """
    cfg = cfg or IndexConfig()
    out = Path(out_dir).absolute()
    if out.exists():
        is_index = (out / MANIFEST).exists()
        if not overwrite:
            what = "an index" if is_index else "a directory"
            raise IndexError_(f"{out} already exists ({what}); pass overwrite=True / --force to replace it")
        if not is_index and (not out.is_dir() or any(out.iterdir())):  # never delete what is not ours
            raise IndexError_(
                f"{out} exists and is not an asearch index; refusing to replace it, choose another --out"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale_builds(out)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    t0 = time.perf_counter()
    try:
        with _Progress(progress) as bar:
            counts, bm25_facts = _write_passages_and_bm25(source, tmp, cfg, bar)
            if counts["passages"] == 0 and not allow_empty:
                raise DataFormatError(
                    getattr(source, "path", source.name), None, None,
                    f"no passages to index ({counts['documents']} documents, {counts['empty_documents']} "
                    "without words); pass allow_empty=True / --allow-empty to build an empty index",
                )  # fmt: skip
            counts.update(_write_pages(source, tmp, bar, tmp / "passage_urls.u64"))
            dense_facts = None
            if dense_builder is not None:
                dense_facts = dense_builder(tmp / "dense", counts["passages"])
            elif cfg.dense is not None:
                dense_facts = _write_dense(tmp, cfg.dense, counts["passages"], bar)
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "corpus": {"name": source.name, "fingerprint": source.fingerprint()},
            "settings": cfg.model_dump(mode="json"),
            "counts": counts,
            "bm25": {"engine": "tantivy", **bm25_facts},
            "dense": dense_facts,
            "versions": _versions(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "build_seconds": round(time.perf_counter() - t0, 2),
            "build_command": build_command or rebuild_command(source.name, out, cfg),
            "files": {
                str(f.relative_to(tmp)): f.stat().st_size
                for f in sorted(tmp.rglob("*"))
                if f.is_file() and not f.name.endswith(".lock")  # tantivy's lock files are touched by readers
            },
        }
        atomic_write_json(tmp / MANIFEST, manifest)  # written last: its presence marks a complete index
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _write_passages_and_bm25(
    source: CorpusSource, tmp: Path, cfg: IndexConfig, bar: _Progress
) -> tuple[dict[str, int], dict[str, Any]]:
    stats = ChunkStats()
    passages = RecordWriter(tmp, "passages", key_field="id")
    bm25 = BM25Writer(tmp / "bm25", cfg.bm25)
    # url hashes of passages, to count passages whose url has no page (8 bytes per document, not per passage)
    urls = array("Q")
    last_url = None
    task = bar.task("passages (store + BM25)")
    pending = 0
    for p in iter_passages(source, cfg.chunk, stats):
        row = passages.add({"id": p.id, "title": p.title, "text": p.text, "url": p.url})
        bm25.add(row, p.contents)
        if p.url != last_url:
            urls.append(key_hash(p.url))
            last_url = p.url
        pending += 1
        if pending == 2048:
            bar.advance(task, pending)
            pending = 0
    bar.advance(task, pending)
    bar.finish(task)
    pstats = passages.close()
    bm25_facts = bm25.close()
    if passages.first_duplicate is not None:
        raise _duplicate_id_error(source, *passages.first_duplicate)
    with open(tmp / "passage_urls.u64", "wb") as f:
        f.write(urls.tobytes())
    counts = {
        "documents": stats.documents,
        "empty_documents": stats.empty_documents,
        "passages": pstats["records"],
        "words": stats.words,
        "duplicate_passage_ids": pstats["duplicate_keys"],
    }
    return counts, bm25_facts


def _duplicate_id_error(source: CorpusSource, passage_id: str, row: int, again: int) -> DataFormatError:
    """Two passages with one id come from two documents with one id (passage ids are `{doc id}#{k}`):
    name the two lines when the source can find them, else the two passage rows."""
    doc_id = passage_id.rpartition("#")[0]
    find_lines = getattr(source, "document_lines", None)
    lines = find_lines(doc_id) if find_lines is not None else []
    rule = "every document needs its own id (a pages line's id is its url), or search hits would share ids"
    if len(lines) >= 2:
        return DataFormatError(
            getattr(source, "path", source.name), lines[1], "id",
            f"duplicate document id {doc_id!r} (first at line {lines[0]}); {rule}",
        )  # fmt: skip
    return DataFormatError(
        source.name, None, "id", f"passage id {passage_id!r} at passage rows {row} and {again}; {rule}"
    )


def _write_pages(source: CorpusSource, tmp: Path, bar: _Progress, passage_urls: Path) -> dict[str, int]:
    pages = RecordWriter(tmp, "pages", key_field="url")
    task = bar.task("pages")
    for i, page in enumerate(source.pages(), start=1):
        pages.add(page.to_dict())
        if i % 2048 == 0:
            bar.advance(task, 2048)
    bar.advance(task, pages.count % 2048)
    bar.finish(task)
    pstats = pages.close()
    url_hashes = np.unique(np.fromfile(passage_urls, dtype=np.uint64))
    page_hashes = np.fromfile(tmp / "pages.keys.u64", dtype=np.uint64)
    passage_urls.unlink()
    return {
        "pages": pstats["records"],
        "duplicate_page_urls": pstats["duplicate_keys"],
        "passage_urls_without_page": int((~np.isin(url_hashes, page_hashes)).sum()),
    }


def _write_dense(tmp: Path, cfg: DenseConfig, n: int, bar: _Progress) -> dict[str, Any]:
    from asearch.retrieval.dense import build_dense

    store = PassageStore(tmp, expected=n)
    task = bar.task("dense embeddings", total=n)
    try:
        return build_dense(store.texts(), n, tmp / "dense", cfg, on_batch=lambda k: bar.advance(task, k))
    finally:
        store.close()


def _swap_into_place(tmp: Path, out: Path) -> None:
    """rename(tmp -> out); an existing `out` is moved aside first and deleted only after the swap."""
    _fsync_dir(tmp)
    if out.exists():
        trash = out.parent / f".{out.name}.replaced-{os.getpid()}"
        os.rename(out, trash)
        os.rename(tmp, out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.rename(tmp, out)
    _fsync_dir(out.parent)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- open


class Index:
    """An opened index directory: passages, pages and retrievers (built lazily, cached, thread-safe)."""

    def __init__(self, path: Path, manifest: dict[str, Any], config: IndexConfig):
        t0 = time.perf_counter()
        self.path = path
        self.manifest = manifest
        self.config = config
        counts = manifest["counts"]
        self._passages = PassageStore(path, expected=counts["passages"])
        self._pages = PageStoreFile(path, expected=counts["pages"])
        self._retrievers: dict[str, Retriever] = {}
        self._lock = threading.Lock()
        self.load_seconds: dict[str, float] = {"stores": time.perf_counter() - t0}

    def __len__(self) -> int:
        return len(self._passages)

    def __repr__(self) -> str:
        c = self.manifest["corpus"]
        return (
            f"Index({str(self.path)!r}, corpus={c['name']!r}, passages={len(self)}, dense={self.has_dense})"
        )

    @property
    def has_dense(self) -> bool:
        return self.manifest.get("dense") is not None

    @property
    def pages(self) -> PageStoreFile:
        """url -> Page (None for an unknown url)."""
        return self._pages

    @property
    def passages(self) -> PassageStore:
        return self._passages

    def passage(self, key: str | int) -> Passage | None:
        """A passage by id (None if unknown) or by row number (the ids the engines return)."""
        if isinstance(key, str):
            return self._passages.get(key)
        return self._passages[int(key)]

    def retriever(self, method: Method = "bm25") -> Retriever:
        """The retriever of search method `method` (a ConfigError names the nearest registered one); opened
        on first use (dense loads its model) and cached."""
        SEARCH_METHODS.get(method)
        with self._lock:
            return self.opened(method)

    def opened(self, method: str) -> Any:
        """The retriever of `method`, opened now unless it already is (callers hold the index's lock: a
        method built over others, as hybrid, opens them through this)."""
        if method in self._retrievers:
            return self._retrievers[method]
        t0 = time.perf_counter()
        r = SEARCH_METHODS.get(method)(self)
        self.load_seconds[method] = time.perf_counter() - t0
        self._retrievers[method] = r
        return r

    def __enter__(self) -> Index:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for r in self._retrievers.values():
            close = getattr(r, "close", None)
            if close:
                close()
        self._passages.close()
        self._pages.close()


def _refuse(path: Path, problem: str, manifest: dict[str, Any] | None = None) -> IndexError_:
    cmd = (manifest or {}).get("build_command") or shlex.join(
        ["asearch", "index", "build", "--corpus", "SPEC", "--out", str(path), "--force"]
    )
    if "--force" not in cmd and path.exists():
        cmd += " --force"
    return IndexError_(f"{path}: {problem}. Rebuild it: {cmd}")


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of the index at `path`, or IndexError_ saying why there is none."""
    p = Path(path)
    if not p.is_dir():
        raise _refuse(p, "no index directory here")
    mf = p / MANIFEST
    if not mf.exists():
        raise _refuse(p, f"no {MANIFEST}: not an index, or a build that did not finish")
    try:
        manifest = json.loads(read_utf8_text(mf))
    except DataFormatError as e:
        raise _refuse(p, f"{MANIFEST} is damaged: {e.problem}") from None
    except json.JSONDecodeError as e:
        raise _refuse(p, f"{MANIFEST} is not valid JSON ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _refuse(p, f"{MANIFEST} is not an asearch index manifest")
    return manifest


@register_search_method("bm25")
def open_bm25(index: Index) -> Retriever:
    """BM25 over the index's tantivy directory."""
    return BM25Retriever(index.path / "bm25", index.config.bm25, index.passages)


@register_search_method("dense")
def open_dense(index: Index) -> Retriever:
    """The faiss index of passage vectors (an index built with --dense)."""
    if not index.has_dense or index.config.dense is None:
        raise IndexError_(
            f"{index.path} has no dense index; rebuild with one: "
            f"{rebuild_command(index.manifest['corpus']['name'], index.path, index.config)} --dense"
        )
    from asearch.retrieval.dense import DenseRetriever

    return DenseRetriever(index.path / "dense", index.config.dense, index.passages, index.manifest["dense"])


@register_search_method("hybrid")
def open_hybrid(index: Index) -> Retriever:
    """Reciprocal-rank fusion of bm25 and dense (`hybrid:` settings)."""
    return HybridRetriever(index.opened("bm25"), index.opened("dense"), index.passages, index.config.hybrid)


def open_index(
    path: str | Path,
    *,
    expect_fingerprint: str | None = None,
    expect_dense_model: str | None = None,
) -> Index:
    """Open and check an index directory; refuse (IndexError_, with the rebuild command) anything off.

    Refused: a missing dir, a partial dir (no manifest, or files missing / of the wrong size), an unknown format
    version, a corpus fingerprint other than `expect_fingerprint`, a dense model other than `expect_dense_model`.
    """
    p = Path(path)
    manifest = read_manifest(p)
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise _refuse(
            p, f"index format version {version!r}; this asearch reads version {FORMAT_VERSION}", manifest
        )
    files = manifest.get("files") or {}
    for rel, size in files.items():
        f = p / rel
        if not f.exists():
            raise _refuse(p, f"file {rel} is missing (partial or damaged index)", manifest)
        if f.stat().st_size != size:
            raise _refuse(
                p, f"file {rel} has {f.stat().st_size} bytes, manifest says {size} (damaged index)", manifest
            )
    corpus = manifest["corpus"]
    if expect_fingerprint is not None and corpus.get("fingerprint") != expect_fingerprint:
        raise _refuse(
            p,
            f"built from corpus {corpus.get('name')!r} with fingerprint {corpus.get('fingerprint')}, "
            f"but the corpus now has fingerprint {expect_fingerprint}",
            manifest,
        )
    if expect_dense_model is not None:
        dense = manifest.get("dense")
        if dense is None:
            raise _refuse(
                p, f"has no dense index, but dense model {expect_dense_model!r} was asked for", manifest
            )
        if expect_dense_model not in (dense.get("model"), dense.get("model_path")):
            raise _refuse(
                p,
                f"dense index was built with model {dense.get('model')!r}, but queries would use "
                f"{expect_dense_model!r} (vectors of different models are not comparable)",
                manifest,
            )
    try:
        config = IndexConfig.model_validate(manifest["settings"])
    except ValidationError as e:
        problem = f"settings in {MANIFEST} are not valid for this asearch ({e.error_count()} errors)"
        raise _refuse(p, problem, manifest) from None
    return Index(p, manifest, config)


def index_size_bytes(manifest: dict[str, Any]) -> int:
    """Bytes on disk of the files an index consists of."""
    return int(sum((manifest.get("files") or {}).values()))
