"""One argument shape for a corpus: `--corpus SPEC` in every command that reads one, and the first argument
in the `corpus` commands and `index build`; both forms give the same result."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from asearch.cli.app import app
from asearch.errors import ConfigError

WORLD = "world:seed=3,entities=100"


def _run(*args: str):
    return CliRunner().invoke(app, list(args), terminal_width=300)


def test_corpus_info_takes_the_spec_either_way() -> None:
    positional, option = _run("corpus", "info", WORLD, "--json"), _run("corpus", "info", "--corpus", WORLD, "--json")
    assert positional.exit_code == 0 and option.exit_code == 0, positional.output + option.output
    assert json.loads(positional.stdout)["documents"] == 100
    assert json.loads(positional.stdout) == json.loads(option.stdout)
    assert _run("corpus", "info", WORLD, "--corpus", WORLD, "--json").exit_code == 0  # the same twice is fine


def test_corpus_show_and_export_take_the_spec_either_way(tmp_path) -> None:
    exported = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    assert _run("corpus", "export", WORLD, "--out", str(exported[0]), "--what", "pages").exit_code == 0
    assert _run("corpus", "export", "--corpus", WORLD, "--out", str(exported[1]), "--what", "pages").exit_code == 0
    assert exported[0].read_text() == exported[1].read_text()
    title = json.loads(exported[0].read_text().splitlines()[0])["title"]
    shown = _run("corpus", "show", WORLD, title), _run("corpus", "show", "--corpus", WORLD, title)
    assert shown[0].exit_code == 0 and shown[0].stdout == shown[1].stdout and title in shown[0].stdout


def test_index_build_takes_the_spec_either_way(tmp_path) -> None:
    from asearch.retrieval.index import read_manifest

    a, b = tmp_path / "a", tmp_path / "b"
    res = _run("index", "build", WORLD, "--out", str(a), "chunk.words=40")
    assert res.exit_code == 0, res.output
    res = _run("index", "build", "--corpus", WORLD, "chunk.words=40", "--out", str(b))
    assert res.exit_code == 0, res.output
    ma, mb = read_manifest(a), read_manifest(b)
    assert ma["corpus"] == mb["corpus"] and ma["counts"] == mb["counts"]
    assert ma["settings"]["chunk"]["words"] == 40


def test_a_missing_or_doubled_corpus_is_one_line() -> None:
    for args in (["corpus", "info"], ["index", "build", "--out", "x"], ["index", "build", "--out", "x", "chunk.words=5"]):
        res = _run(*args)
        assert isinstance(res.exception, ConfigError) and "give a corpus" in str(res.exception), args
    res = _run("corpus", "info", "wiki10k", "--corpus", WORLD)
    assert isinstance(res.exception, ConfigError) and "two corpora given" in str(res.exception)
    res = _run("index", "build", "wiki10k", "--corpus", WORLD, "--out", "x")
    assert isinstance(res.exception, ConfigError) and "two corpora given" in str(res.exception)
