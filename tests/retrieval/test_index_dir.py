"""The index directory: build -> open -> search round trip, manifest checks, refusals, atomic builds, stores, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from asearch.corpus.types import Document, Page
from asearch.errors import IndexError_
from asearch.retrieval.base import PageStore
from asearch.retrieval.index import FORMAT_VERSION, IndexConfig, build_index, open_index
from asearch.retrieval.store import PageStoreFile, RecordWriter


class ListSource:
    """A CorpusSource over in-test documents and pages."""

    def __init__(self, docs: list[Document], pages: list[Page] | None = None, fingerprint: str = "fp-1"):
        self.docs, self.name, self._fp = docs, "listsource", fingerprint
        self._pages = pages if pages is not None else [Page(d.url, d.title, d.text) for d in docs]

    def documents(self):
        return iter(self.docs)

    def pages(self):
        return iter(self._pages)

    def fingerprint(self) -> str:
        return self._fp


def long_doc(i: int, n_words: int) -> Document:
    words = " ".join(f"w{i}x{j}" for j in range(n_words))
    return Document(id=f"doc{i}", title=f"Doc {i}", text=words, url=f"https://example.org/doc/{i}")


DOCS = [
    Document(
        "a",
        "Alpha",
        "Alpha particles are helium nuclei emitted in radioactive decay.",
        "https://ex.org/alpha",
    ),
    Document(
        "b", "Beta", "Beta decay emits an electron or positron from an atomic nucleus.", "https://ex.org/beta"
    ),
    long_doc(2, 250),  # 250 words at chunk.words=100 -> passages doc2#0..#2
    Document("empty", "Empty", "   ", "https://ex.org/empty"),  # no words: counted, no passage
]


@pytest.fixture()
def built(tmp_path):
    out = build_index(ListSource(DOCS), tmp_path / "idx", IndexConfig(), progress=False)
    return out


def test_round_trip_build_open_search(built):
    with open_index(built) as index:
        assert len(index) == 5  # a, b, doc2#0..2
        m = index.manifest
        assert m["format_version"] == FORMAT_VERSION
        assert m["corpus"] == {"name": "listsource", "fingerprint": "fp-1"}
        assert m["counts"]["documents"] == 4 and m["counts"]["empty_documents"] == 1
        assert m["counts"]["passages"] == 5 and m["counts"]["pages"] == 4
        assert m["settings"]["chunk"]["words"] == 100 and m["dense"] is None
        assert m["versions"]["tantivy"] and m["versions"]["asearch"]
        assert m["build_command"].startswith("asearch index build --corpus listsource --out ")
        assert set(m["files"]) >= {"passages.jsonl", "pages.jsonl", "bm25/meta.json"}
        hits = index.retriever("bm25").search(["helium nuclei", "w2x150"], 2)
        assert hits[0][0].passage.id == "a#0" and hits[0][0].passage.url == "https://ex.org/alpha"
        assert hits[1][0].passage.id == "doc2#1"  # word 150 lives in the second 100-word window
        assert hits[1][0].passage.text.split()[0] == "w2x100"
        assert index.passage("doc2#2").text.split() == [f"w2x{j}" for j in range(200, 250)]
        assert index.passage(1).id == "b#0"
        assert index.passage("nope#0") is None
        assert index.retriever("bm25") is index.retriever("bm25")  # cached
        with pytest.raises(IndexError_, match="no dense index.*--dense"):
            index.retriever("dense")


def test_page_store_lookups(built):
    with open_index(built) as index:
        pages = index.pages
        assert isinstance(pages, PageStore)
        assert len(pages) == 4
        page = pages.get("https://ex.org/beta")
        assert page is not None and page.title == "Beta" and "positron" in page.contents
        assert pages.get("https://ex.org/unknown") is None
        assert pages.get("") is None
        assert "https://ex.org/alpha" in pages and "https://ex.org/gamma" not in pages


def test_duplicate_urls_are_counted_and_the_first_page_wins(tmp_path):
    pages = [
        Page("https://u/1", "one", "first copy"),
        Page("https://u/2", "two", "other"),
        Page("https://u/1", "one", "second copy"),
    ]
    docs = [Document("x", "X", "text of x", "https://u/1"), Document("y", "Y", "text of y", "https://u/3")]
    out = build_index(ListSource(docs, pages), tmp_path / "idx", progress=False)
    with open_index(out) as index:
        assert index.manifest["counts"]["duplicate_page_urls"] == 1
        assert index.manifest["counts"]["passage_urls_without_page"] == 1  # https://u/3
        assert index.pages.get("https://u/1").contents == "first copy"


def test_record_writer_handles_many_records_and_hash_lookups(tmp_path):
    w = RecordWriter(tmp_path, "pages", key_field="url")
    n = 70_000  # more than one offsets flush
    for i in range(n):
        w.add({"url": f"https://p/{i}", "title": str(i), "contents": f"page {i} " + "é" * (i % 7)})
    assert w.close() == {"records": n, "duplicate_keys": 0}
    store = PageStoreFile(tmp_path, expected=n)
    for i in (0, 1, 65_535, 65_536, n - 1):
        assert store.get(f"https://p/{i}").contents == f"page {i} " + "é" * (i % 7)
    assert store.get(f"https://p/{n}") is None
    with pytest.raises(IndexError_, match="manifest says 5 records"):
        PageStoreFile(tmp_path, expected=5)


def test_fingerprint_mismatch_is_refused_with_the_rebuild_command(built):
    with pytest.raises(IndexError_) as e:
        open_index(built, expect_fingerprint="fp-2")
    msg = str(e.value)
    assert "fingerprint fp-1" in msg and "fp-2" in msg
    assert "Rebuild it: asearch index build --corpus listsource" in msg and "--force" in msg
    open_index(built, expect_fingerprint="fp-1").close()


def test_dense_model_expectation_on_a_bm25_only_index_is_refused(built):
    with pytest.raises(IndexError_, match="no dense index.*'my-model'"):
        open_index(built, expect_dense_model="my-model")


def test_missing_partial_and_damaged_dirs_are_refused(built, tmp_path):
    with pytest.raises(IndexError_, match="no index directory here.*Rebuild it"):
        open_index(tmp_path / "nothing")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "passages.jsonl").write_text("{}\n")
    with pytest.raises(IndexError_, match="no manifest.json.*did not finish"):
        open_index(partial)
    with open(built / "passages.jsonl", "ab") as f:  # damaged: a file no longer has the recorded size
        f.write(b"x")
    with pytest.raises(IndexError_, match="passages.jsonl has .* bytes, manifest says"):
        open_index(built)


def test_unknown_format_version_is_refused(built):
    m = json.loads((built / "manifest.json").read_text())
    m["format_version"] = FORMAT_VERSION + 1
    (built / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(IndexError_, match=f"format version {FORMAT_VERSION + 1}; this asearch reads"):
        open_index(built)


def test_existing_index_is_replaced_only_with_overwrite(built):
    with pytest.raises(IndexError_, match="already exists.*--force"):
        build_index(ListSource(DOCS[:1]), built, progress=False)
    build_index(ListSource(DOCS[:1], fingerprint="fp-new"), built, progress=False, overwrite=True)
    with open_index(built) as index:
        assert len(index) == 1 and index.manifest["corpus"]["fingerprint"] == "fp-new"
    assert not [p for p in built.parent.iterdir() if p.name.startswith(".")]  # no temp or trash dirs left
    precious = built.parent / "precious"
    precious.mkdir()
    (precious / "thesis.txt").write_text("years of work")
    with pytest.raises(IndexError_, match="is not an asearch index; refusing to replace it"):
        build_index(ListSource(DOCS[:1]), precious, progress=False, overwrite=True)
    assert (precious / "thesis.txt").exists()


KILLED_BUILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from asearch.corpus.types import Document, Page
    from asearch.retrieval.index import build_index

    class Hanging:
        name, ready = "hanging", Path(sys.argv[2])
        def documents(self):
            for i in range(5000):
                yield Document(f"d{i}", "t", f"word{i} some text", f"https://h/{i}")
            self.ready.write_text("go")
            time.sleep(600)  # killed here: passages written, build not finished
        def pages(self):
            return iter([])
        def fingerprint(self):
            return "h"

    build_index(Hanging(), sys.argv[1], progress=False)
    """
)


def test_a_killed_build_leaves_nothing_that_opens_and_is_cleaned_up_later(tmp_path):
    script = tmp_path / "build.py"
    script.write_text(KILLED_BUILD)
    out, ready = tmp_path / "idx", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert proc.poll() is None, "build exited early"
            assert time.monotonic() < deadline, "build never reached the kill point"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".idx.building-")]
    assert len(leftovers) == 1 and (leftovers[0] / "passages.jsonl").stat().st_size > 0
    assert not out.exists()
    with pytest.raises(IndexError_, match="no index directory here"):
        open_index(out)
    with pytest.raises(IndexError_, match="no manifest.json"):
        open_index(leftovers[0])
    build_index(ListSource(DOCS[:2]), out, progress=False)  # the next build removes the dead build's dir
    assert not leftovers[0].exists()
    assert len(open_index(out)) == 2


def test_cli_build_info_search(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from asearch.cli.index import app

    corpus = tmp_path / "mini.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"id": d.id, "title": d.title, "text": d.text, "url": d.url}) for d in DOCS[:3])
        + "\n"
    )
    monkeypatch.setenv("COLUMNS", "200")
    runner = CliRunner()
    out = tmp_path / "idx"
    r = runner.invoke(app, ["build", "--corpus", str(corpus), "--out", str(out), "chunk.words=50"])
    assert r.exit_code == 0, r.output
    assert "7 passages from 3 documents" in r.output  # 1 + 1 + 250/50
    with open_index(out) as index:
        assert index.manifest["settings"]["chunk"]["words"] == 50
    r = runner.invoke(app, ["info", str(out)])
    assert r.exit_code == 0 and "passages" in r.output and "mini" in r.output, r.output
    r = runner.invoke(app, ["search", str(out), "radioactive helium", "--topk", "1"])
    assert r.exit_code == 0 and "a#0" in r.output and "1 hits" in r.output, r.output
    r = runner.invoke(app, ["build", "--corpus", str(corpus), "--out", str(out)])
    assert r.exit_code != 0 and isinstance(r.exception, IndexError_)
