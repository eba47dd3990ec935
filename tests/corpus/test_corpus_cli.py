"""`asearch corpus info|export|show` and `open_corpus` spec parsing, through typer's runner and a real process."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest
from typer.testing import CliRunner

from asearch.cli.corpus import app
from asearch.corpus import ChunkConfig, JsonlCorpus, iter_passages, open_corpus, read_documents, read_pages
from asearch.corpus.sources import parse_world_spec
from asearch.errors import AsearchError, ConfigError

runner = CliRunner()


@pytest.fixture
def small(tmp_path):
    path = tmp_path / "small.jsonl"
    lines = [
        {"id": "0", "contents": '"Alpha"\n' + " ".join(f"a{i}" for i in range(150))},
        {"id": "1", "contents": '"Beta"\nbeta is short'},
        {"id": "2", "title": "Gamma", "text": "gamma text here", "url": "https://e.org/Gamma"},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_every_command_has_help():
    for args in ([], ["info"], ["export"], ["show"]):
        res = runner.invoke(app, [*args, "--help"])
        assert res.exit_code == 0 and "Usage" in res.output, (args, res.output)


def test_info_counts_match_the_library(small):
    res = runner.invoke(app, ["info", str(small), "--json", "--words", "40"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout.strip().splitlines()[-1])
    corpus = JsonlCorpus(small)
    assert info["documents"] == 3 and info["pages"] == 3
    assert info["passages"] == len(list(iter_passages(corpus, ChunkConfig(words=40)))) == 4 + 1 + 1
    assert info["words"] == 150 + 3 + 3
    assert info["fingerprint"] == corpus.fingerprint()
    assert info["chunking"]["words"] == 40


def test_info_counts_and_names_duplicate_ids(tmp_path, small):
    assert "duplicate_ids" not in json.loads(runner.invoke(app, ["info", str(small), "--json"]).stdout.splitlines()[-1])
    path = tmp_path / "dups.jsonl"
    ids = ["a", "b", "a", "c", "b", "a", "d"]
    path.write_text("".join(json.dumps({"id": i, "contents": f"doc {n}"}) + "\n" for n, i in enumerate(ids)))
    res = runner.invoke(app, ["info", str(path), "--json"])
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["documents"] == 7 and info["duplicate_ids"] == 3
    assert info["duplicate_id_examples"] == "'a' (3 times), 'b' (2 times)"
    table = runner.invoke(app, ["info", str(path)])
    assert table.exit_code == 0 and "duplicate_ids" in table.output and "index build" in table.output


def test_info_rejects_bad_chunking_with_the_value():
    res = runner.invoke(app, ["info", "wiki10k", "--words", "10", "--overlap", "12"])
    assert isinstance(res.exception, ConfigError) and "overlap=12" in str(res.exception)


@pytest.mark.parametrize("what", ["passages", "pages", "documents"])
def test_export_writes_records_that_read_back(small, tmp_path, what):
    out = tmp_path / "out" / f"{what}.jsonl"
    res = runner.invoke(app, ["export", str(small), "--out", str(out), "--what", what, "--words", "100"])
    assert res.exit_code == 0, res.output
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert f"wrote {len(records)} {what}" in res.stdout
    corpus = JsonlCorpus(small)
    if what == "passages":
        assert [set(r) for r in records] == [{"id", "contents", "url", "title"}] * 4
        assert records[1] == {
            "id": "0#1",
            "contents": '"Alpha"\n' + " ".join(f"a{i}" for i in range(100, 150)),
            "url": "corpus://small/0",
            "title": "Alpha",
        }
        # the wiki-18 shape reads back as the same passages
        assert [(d.title, d.text, d.url) for d in read_documents(out)] == [
            (p.title, p.text, p.url) for p in iter_passages(corpus)
        ]
    elif what == "pages":
        assert list(read_pages(out)) == list(corpus.pages())
        assert records[2] == {
            "url": "https://e.org/Gamma",
            "title": "Gamma",
            "contents": "Gamma\ngamma text here",
        }
    else:
        assert [(d.id, d.title, d.text, d.url) for d in read_documents(out)] == [
            (d.id, d.title, d.text, d.url) for d in corpus.documents()
        ]


def test_show_finds_by_title_url_and_case(small):
    by_title = runner.invoke(app, ["show", str(small), "Gamma"])
    by_url = runner.invoke(app, ["show", str(small), "corpus://small/1"])
    by_case = runner.invoke(app, ["show", str(small), "alpha"])
    assert "gamma text here" in by_title.stdout
    assert "beta is short" in by_url.stdout
    assert "a149" in by_case.stdout
    missing = runner.invoke(app, ["show", str(small), "Delt"])
    assert isinstance(missing.exception, AsearchError) and "'Delt'" in str(missing.exception)


def test_show_wiki10k_accepts_a_wikipedia_url():
    res = runner.invoke(app, ["show", "wiki10k", "https://en.wikipedia.org/wiki/Federico_Garc%C3%ADa_Lorca"])
    assert res.exit_code == 0, res.output
    assert "Spanish poet" in res.stdout and "Federico García Lorca" in res.stdout


def test_open_corpus_names_paths_and_errors(small, tmp_path, monkeypatch):
    assert open_corpus("wiki10k").name == "wiki10k"
    assert isinstance(open_corpus(str(small)), JsonlCorpus)
    with pytest.raises(AsearchError, match="no such name or file.*wiki10k.*world"):
        open_corpus(str(tmp_path / "nope.jsonl"))
    with pytest.raises(AsearchError, match="directory"):
        open_corpus(str(tmp_path))

    made = []
    fake = types.ModuleType("asearch.corpus.world")
    fake.WorldCorpus = lambda **kw: made.append(kw) or kw  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "asearch.corpus.world", fake)
    open_corpus("world")
    open_corpus("world:7")
    open_corpus("world:seed=7,entities=3000")
    assert made == [{}, {"seed": 7}, {"seed": 7, "n_entities": 3000}]


@pytest.mark.parametrize(
    ("spec", "shown"),
    [("world:seed=7,size=3", "'size=3'"), ("world:x", "got 'x'"), ("world:seed=", "got ''")],
)
def test_world_spec_errors_name_the_bad_part(spec, shown):
    with pytest.raises(ConfigError) as err:
        parse_world_spec(spec)
    assert shown in str(err.value)


def test_fingerprint_changes_with_content(small):
    before = JsonlCorpus(small).fingerprint()
    with open(small, "a") as f:
        f.write(json.dumps({"id": "9", "contents": '"Z"\nz'}) + "\n")
    after = JsonlCorpus(small).fingerprint()
    assert (
        before != after and after.startswith("small:sha256:") and after.endswith(f":{small.stat().st_size}")
    )


def test_real_process_wiki10k_info_and_error_exit(tmp_path):
    ok = subprocess.run(
        [sys.executable, "-m", "asearch", "corpus", "info", "wiki10k", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    info = json.loads(ok.stdout)
    assert (info["documents"], info["pages"], info["license"]) == (10_033, 10_033, "CC BY-SA 4.0")
    bad = subprocess.run(
        [sys.executable, "-m", "asearch", "corpus", "show", "wiki10k", "No Such Page Title"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "AsearchError" in bad.stderr and "Traceback" not in bad.stderr
