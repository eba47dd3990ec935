"""Corpus jsonl formats: every accepted shape parses; every malformed line names file, line and field."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asearch.corpus import read_documents, read_pages, synthetic_url, write_jsonl
from asearch.corpus.formats import corpus_name_for, looks_like_title
from asearch.corpus.types import Document, Page
from asearch.errors import DataFormatError


def _write(path: Path, *lines: object) -> Path:
    with open(path, "w", encoding="utf-8") as f:
        for line in lines:
            f.write(line if isinstance(line, str) else json.dumps(line, ensure_ascii=False))
            f.write("\n")
    return path


def test_wiki18_title_is_the_unquoted_first_line_and_url_is_synthesised(tmp_path):
    path = _write(
        tmp_path / "wiki-18.jsonl",
        {"id": "0", "contents": '"Aaron"\nAaron is a prophet.\nSecond line.'},
        {"id": 7, "contents": "Plain Title\nbody text"},
    )
    docs = list(read_documents(path))
    assert docs[0] == Document(
        id="0", title="Aaron", text="Aaron is a prophet.\nSecond line.", url="corpus://wiki-18/0"
    )
    assert docs[1].id == "7" and docs[1].title == "Plain Title" and docs[1].text == "body text"
    assert docs[1].url == synthetic_url("wiki-18", "7")
    assert list(read_documents(path)) == docs  # stable across reads


def test_synthetic_url_depends_on_file_name_and_encodes_ids(tmp_path):
    a = _write(tmp_path / "a.jsonl", {"id": "x/y #1", "contents": '"T"\ntext'})
    b = _write(tmp_path / "b.jsonl", {"id": "x/y #1", "contents": '"T"\ntext'})
    (url_a,) = [d.url for d in read_documents(a)]
    (url_b,) = [d.url for d in read_documents(b)]
    assert url_a == "corpus://a/x%2Fy%20%231"
    assert url_b == "corpus://b/x%2Fy%20%231"
    assert corpus_name_for("dir/wiki-18.jsonl") == "wiki-18"


def test_wiki18_line_with_url_keeps_it(tmp_path):
    path = _write(tmp_path / "c.jsonl", {"id": "1", "contents": '"T"\ntext', "url": "https://x.org/T"})
    assert next(read_documents(path)).url == "https://x.org/T"


def test_title_text_format_with_and_without_url(tmp_path):
    path = _write(
        tmp_path / "docs.jsonl",
        {"id": "a", "title": " Alpha ", "text": "alpha text", "url": "https://e.org/alpha"},
        "",  # blank lines are skipped but still counted in line numbers
        {"id": "b", "title": "Beta", "text": "beta text"},
    )
    docs = list(read_documents(path))
    assert docs == [
        Document("a", "Alpha", "alpha text", "https://e.org/alpha"),
        Document("b", "Beta", "beta text", "corpus://docs/b"),
    ]


def test_pages_format_title_from_heading_line_else_url(tmp_path):
    path = _write(
        tmp_path / "pages.jsonl",
        {"url": "https://e.org/1", "contents": "Heading\nBody one."},
        {"url": "https://e.org/2", "contents": "This first line is a whole sentence.\nMore."},
        {"url": "https://e.org/3", "contents": "single line only"},
        {"url": "https://e.org/4", "contents": '"Given"\nbody', "title": "Given"},
    )
    docs = list(read_documents(path))
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("https://e.org/1", "Heading", "Body one."),
        ("https://e.org/2", "https://e.org/2", "This first line is a whole sentence.\nMore."),
        ("https://e.org/3", "https://e.org/3", "single line only"),
        ("https://e.org/4", "Given", "body"),
    ]
    assert looks_like_title("Greta Garbo") and not looks_like_title("It rained.")


GOOD = {"id": "0", "contents": '"T"\ntext'}

MALFORMED = [
    ("wiki18 contents not a string", {"id": "1", "contents": 5}, "contents", "expected a string"),
    ("wiki18 no text after title", {"id": "1", "contents": '"T"\n   '}, "contents", "no text"),
    ("wiki18 empty contents", {"id": "1", "contents": ""}, "contents", "empty"),
    ("wiki18 id wrong type", {"id": [1], "contents": '"T"\nx'}, "id", "expected a string"),
    ("wiki18 url wrong type", {"id": "1", "contents": '"T"\nx', "url": 3}, "url", "expected a string"),
    ("id only", {"id": "1"}, "contents", "missing"),
    ("title/text missing title", {"id": "1", "text": "x"}, "title", "missing"),
    ("title/text missing id", {"title": "T", "text": "x"}, "id", "missing"),
    ("title/text empty text", {"id": "1", "title": "T", "text": " "}, "text", "empty"),
    ("title/text text not a string", {"id": "1", "title": "T", "text": None}, "text", "expected a string"),
    ("pages missing url", {"contents": "T\nx"}, "url", "missing"),
    ("pages missing contents", {"url": "https://e.org"}, "contents", "missing"),
    (
        "pages title wrong type",
        {"url": "https://e.org", "contents": "x", "title": 1},
        "title",
        "expected a string",
    ),
]


@pytest.mark.parametrize(("case", "line", "field", "problem"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_line_names_file_line_and_field(tmp_path, case, line, field, problem):
    path = _write(tmp_path / "bad.jsonl", GOOD, "", line, GOOD)
    with pytest.raises(DataFormatError) as err:
        list(read_documents(path))
    e = err.value
    assert (e.path, e.line, e.field) == (str(path), 3, field)
    assert problem in e.problem
    assert f"{path}:3: field {field!r}:" in str(e)
    with pytest.raises(DataFormatError) as err_pages:  # the pages reader checks the same lines
        list(read_pages(path))
    assert (err_pages.value.line, err_pages.value.field) == (3, field)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("[1, 2]", "expected a JSON object"),
        ('{"id": ', "not valid JSON"),
        ('{"foo": 1}', "unrecognised keys ['foo']"),
    ],
)
def test_non_objects_and_unknown_shapes_name_the_line(tmp_path, raw, problem):
    path = _write(tmp_path / "bad.jsonl", GOOD, raw)
    with pytest.raises(DataFormatError) as err:
        list(read_documents(path))
    assert err.value.line == 2 and problem in str(err.value) and str(path) in str(err.value)


def test_read_pages_uses_pages_as_is_and_merges_consecutive_same_url_documents(tmp_path):
    path = _write(
        tmp_path / "mixed.jsonl",
        {"url": "https://e.org/p", "contents": "Page P\nline one\nline two"},
        {"id": "a#0", "title": "A", "text": "first part", "url": "https://e.org/a"},
        {"id": "a#1", "title": "A", "text": "second part", "url": "https://e.org/a"},
        {"id": "b", "title": "B", "text": "bee"},
        {"id": "a#2", "title": "A", "text": "late part", "url": "https://e.org/a"},
    )
    pages = list(read_pages(path))
    assert pages == [
        Page("https://e.org/p", "Page P", "Page P\nline one\nline two"),
        Page("https://e.org/a", "A", "A\nfirst part\nsecond part"),
        Page("corpus://mixed/b", "B", "B\nbee"),
        Page("https://e.org/a", "A", "A\nlate part"),  # not consecutive: a second page, not a silent merge
    ]


def test_write_jsonl_is_atomic_when_the_producer_fails(tmp_path):
    out = tmp_path / "out.jsonl"
    assert write_jsonl(out, ({"i": i} for i in range(3))) == 3
    before = out.read_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's private 0600

    def failing():
        yield {"i": 99}
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError):
        write_jsonl(out, failing())
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temp file left behind
    assert [json.loads(x)["i"] for x in before.decode().splitlines()] == [0, 1, 2]
