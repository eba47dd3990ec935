"""The checks behind the command-line table (test_cli_bad_inputs.py), at the library level: undecodable text
named by file, line and byte; empty inputs refused unless allowed; duplicate corpus ids refused with both
lines; option values validated by their config model; long fields cut in `asearch data show`."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from asearch.cli.console import from_options
from asearch.cli.eval import data_app
from asearch.cli.index import app as index_app
from asearch.config.base import load_yaml
from asearch.corpus import JsonlCorpus, open_corpus
from asearch.corpus.types import Document, Page
from asearch.errors import ConfigError, DataFormatError
from asearch.eval.datasets import load_dataset, read_qa_file
from asearch.files import iter_jsonl, read_utf8_text
from asearch.retrieval.index import build_index, open_index
from asearch.retrieval.server import ServerConfig

runner = CliRunner()


def _jsonl(*objs: dict) -> bytes:
    return b"".join((json.dumps(o) + "\n").encode() for o in objs)


class Docs:
    """A CorpusSource over in-test documents that cannot say which line a document came from."""

    name = "docs"

    def __init__(self, docs: list[Document]):
        self.docs = docs

    def documents(self):
        return iter(self.docs)

    def pages(self):
        return iter(Page(d.url, d.title, d.text) for d in self.docs)

    def fingerprint(self) -> str:
        return "docs-1"


# --------------------------------------------------------------------------- text that is not UTF-8


def test_a_line_that_is_not_utf8_is_named_with_its_byte(tmp_path):
    p = tmp_path / "q.jsonl"
    first = _jsonl({"a": 1})
    p.write_bytes(first + b'{"a": "caf\xe9"}\n')
    with pytest.raises(DataFormatError, match=rf"q\.jsonl:2: not UTF-8 text \(byte 0xe9 at byte {len(first) + 10} "):
        list(iter_jsonl(p))


def test_a_bom_is_dropped_and_a_tail_torn_inside_a_character_is_tolerated(tmp_path):
    p = tmp_path / "q.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + _jsonl({"a": 1}, {"a": "é"}) + '{"a": "é'.encode()[:-1])
    assert [o["a"] for _, o in iter_jsonl(p, tolerate_torn_tail=True)] == [1, "é"]
    with pytest.raises(DataFormatError, match=r"q\.jsonl:3: not UTF-8"):
        list(iter_jsonl(p))


def test_read_utf8_text_names_the_line_and_keeps_good_text(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes("ok\nnaïve\n".encode() + b"x\xffy\n")
    with pytest.raises(DataFormatError, match=r"t\.txt:3: not UTF-8 text \(byte 0xff at byte 11 "):
        read_utf8_text(p)
    p.write_bytes(b"\xef\xbb\xbfseed: 1\n")
    assert read_utf8_text(p) == "seed: 1\n"


@pytest.mark.parametrize(
    "data, shown",
    [
        (b"\x89PNG\r\n\x1a\n\x00", r"c\.yaml:1: not UTF-8 text \(byte 0x89 at byte 0 "),
        (b"seed: 1\n# caf\xe9\n", r"c\.yaml:2: not UTF-8 text \(byte 0xe9 at byte 13 "),
        (b"seed: 1\nout: a\x00b\n", r"c\.yaml:2: invalid YAML: special characters are not allowed \(character U\+0000\)"),
    ],
)  # fmt: skip
def test_a_config_that_is_not_text_is_a_config_error_with_its_line(tmp_path, data, shown):
    p = tmp_path / "c.yaml"
    p.write_bytes(data)
    with pytest.raises(ConfigError, match=shown):
        load_yaml(p)
    with pytest.raises(ConfigError, match="is a directory"):
        load_yaml(tmp_path)


# --------------------------------------------------------------------------- empty inputs


@pytest.mark.parametrize("name, data", [("e.jsonl", b""), ("e.jsonl", b"\n \n"), ("e.json", b"[\n]\n")])
def test_a_dataset_without_questions_is_refused_unless_allowed(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    with pytest.raises(DataFormatError, match=rf"{name}: no questions in it .* --allow-empty"):
        read_qa_file(p)
    with pytest.raises(DataFormatError, match="no questions"):
        load_dataset(str(p))
    assert load_dataset(str(p), allow_empty=True) == []


def test_an_empty_corpus_is_refused_at_open_and_at_build_unless_allowed(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b" \n\n")
    with pytest.raises(DataFormatError, match=r"c\.jsonl: no documents in it .* --allow-empty"):
        open_corpus(str(p))
    with pytest.raises(DataFormatError, match=r"docs: no passages to index \(0 documents"):
        build_index(Docs([]), tmp_path / "refused", progress=False)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["c.jsonl"]  # nothing half-built left behind
    out = build_index(open_corpus(str(p), allow_empty=True), tmp_path / "idx", progress=False, allow_empty=True)
    with open_index(out) as index:
        assert len(index) == 0 and index.retriever("bm25").search(["anything"], 3) == [[]]


def test_index_build_allow_empty_flag(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_bytes(b"")
    res = runner.invoke(index_app, ["build", "--corpus", str(p), "--out", str(tmp_path / "i")])
    assert isinstance(res.exception, DataFormatError) and "--allow-empty" in str(res.exception)
    res = runner.invoke(index_app, ["build", "--corpus", str(p), "--out", str(tmp_path / "i"), "--allow-empty"])
    assert res.exit_code == 0, res.output
    with open_index(tmp_path / "i") as index:
        assert index.manifest["counts"]["passages"] == 0


# --------------------------------------------------------------------------- duplicate corpus ids


@pytest.mark.parametrize(
    "lines, doc_id",
    [
        ([{"id": 7, "title": "A", "text": "one"}, {"id": "8", "title": "B", "text": "two"},
          {"id": "7", "title": "C", "text": "three"}], "7"),  # an integer id and its string are one id
        ([{"url": "https://u/1", "contents": "one"}, {"id": "x", "contents": "\"T\"\ntwo"},
          {"url": "https://u/1", "contents": "three"}], "https://u/1"),  # pages lines: the url is the id
    ],
)  # fmt: skip
def test_duplicate_document_ids_refuse_the_build_naming_both_lines(tmp_path, lines, doc_id):
    p = tmp_path / "c.jsonl"
    p.write_bytes(_jsonl(*lines))
    with pytest.raises(DataFormatError) as err:
        build_index(JsonlCorpus(p), tmp_path / "idx", progress=False)
    assert (err.value.path, err.value.line, err.value.field) == (str(p), 3, "id")
    assert f"duplicate document id {doc_id!r} (first at line 1)" in str(err.value)
    assert not (tmp_path / "idx").exists() and sorted(f.name for f in tmp_path.iterdir()) == ["c.jsonl"]


def test_duplicate_ids_of_a_source_without_lines_name_the_passage_rows(tmp_path):
    docs = [Document(i, "T", "some words here", f"https://u/{n}") for n, i in enumerate(["a", "b", "a"])]
    with pytest.raises(DataFormatError, match=r"docs: field 'id': passage id 'a#0' at passage rows 0 and 2"):
        build_index(Docs(docs), tmp_path / "idx", progress=False)


# --------------------------------------------------------------------------- option values, long fields


def test_option_values_are_checked_by_the_config_and_named_as_options():
    base = ServerConfig(host="127.0.0.1", port=9000)
    with pytest.raises(ConfigError, match=r"^--port: Input should be less than or equal to 65535 \(got 70000\)$"):
        from_options(ServerConfig, {"port": 70000}, over=base)
    assert from_options(ServerConfig, {"port": 8001}, over=base).model_dump() == {**base.model_dump(), "port": 8001}


def test_data_show_cuts_huge_fields_and_json_keeps_them(tmp_path):
    p = tmp_path / "big.jsonl"
    question = "why " * 1_250_000  # 5 MB: the table used to render all of it
    p.write_text(json.dumps({"id": "big", "question": question, "answer": "x" * 1000}) + "\n")
    res = runner.invoke(data_app, ["show", str(p)])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())  # rich wraps long lines at the terminal width
    assert len(res.output) < 2000 and f"(+{len(question.strip()) - 300:,} chars)" in flat
    res = runner.invoke(data_app, ["show", str(p), "--json"])
    assert json.loads(res.output)["question"] == question.strip()


def test_data_show_allow_empty_reports_no_questions(tmp_path):
    p = tmp_path / "nothing.jsonl"
    p.write_bytes(b"\n")
    assert isinstance(runner.invoke(data_app, ["show", str(p)]).exception, DataFormatError)
    res = runner.invoke(data_app, ["show", str(p), "--allow-empty"])
    assert res.exit_code == 0 and "nothing: 0 questions" in res.output
