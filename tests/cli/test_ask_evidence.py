"""`asearch ask` prints the answer beside the evidence it read: the passages of its tool results (in every
format tools/render.py writes), and the sentences of those that contain the answer; no answer is said so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asearch.cli.ask import Passage, _passages, answer_lines
from asearch.corpus.types import Passage as CorpusPassage
from asearch.retrieval.base import SearchHit
from asearch.tools.render import chunk_page, render_search

PAGES = [
    {"id": "ada", "title": "Ada Varn", "text": "Ada Varn was born in Oslen. She wrote two books.",
     "url": "https://mini.example/wiki/Ada_Varn"},
    {"id": "mer", "title": "Mercury (planet)", "text": "Mercury is the first planet. Ada Varn never saw it.",
     "url": "https://mini.example/wiki/Mercury_(planet)"},
]  # fmt: skip
HITS = [SearchHit(CorpusPassage(p["id"], p["title"], p["text"], p["url"]), 1.0) for p in PAGES]


@pytest.mark.parametrize(
    ("options", "titles"),
    [
        ({}, ["Ada Varn", "Mercury (planet)"]),
        ({"show_urls": False}, ["Ada Varn", "Mercury (planet)"]),
        ({"compact": True}, ["Ada_Varn", "Mercury_(planet)"]),  # no title line: the url's page name
        ({"compact": True, "show_urls": False}, ["[Doc 1]", "[Doc 2]"]),
    ],
    ids=["urls", "no-urls", "compact", "compact-no-urls"],
)
def test_search_results_read_back_as_passages(options, titles) -> None:
    passages = _passages(render_search(HITS, "q", max_doc_chars=400, **options))
    assert [p.title for p in passages] == titles
    assert [p.text for p in passages] == [p["text"] for p in PAGES]
    with_urls = options.get("show_urls", True)
    assert [p.url for p in passages] == ([h.passage.url for h in HITS] if with_urls else ["", ""])


def test_page_chunks_read_back_as_passages() -> None:
    page = chunk_page("Ada Varn was born in Oslen.\nShe wrote two books.\n", "https://mini.example/wiki/Ada_Varn",
                      chunk_chars=30, max_chunks=4, at_lines=True)  # fmt: skip
    passages = _passages("\n".join(page.chunks))
    assert [p.text for p in passages] == ["Ada Varn was born in Oslen.", "She wrote two books."]
    assert {p.url for p in passages} == {"https://mini.example/wiki/Ada_Varn"}
    assert _passages("No search results were found for the query 'x'.") == []


def test_answer_lines_are_the_sentences_holding_the_answer() -> None:
    p = Passage("2001", "u", "1968 film by Stanley Kubrick. It was directed by Stanley Kubrick with Arthur C. Clarke. "
                "It is long.")  # fmt: skip
    assert answer_lines(p, "stanley kubrick") == [
        "1968 film by Stanley Kubrick.", "It was directed by Stanley Kubrick with Arthur C. Clarke."
    ]
    assert answer_lines(p, "Paris") == [] and answer_lines(p, None) == [] and answer_lines(p, " ") == []


# --------------------------------------------------------------------------- the command


def _ask(tmp_path: Path, tok_dir: Path, replies: list[str], *extra: str) -> subprocess.CompletedProcess:
    corpus = tmp_path / "pages.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PAGES))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # a pipe with no width given
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    return subprocess.run(
        [sys.executable, "-m", "asearch", "ask", "Where was Ada Varn born?", "--engine", "scripted",
         "--model", str(tok_dir), "--corpus", str(corpus), "--style", "search-r1",
         f"engine.replies={json.dumps(replies)}", *extra],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip


def test_the_answer_comes_with_the_lines_that_hold_it(tmp_path, tok_dir) -> None:
    res = _ask(tmp_path, tok_dir, ["<search>Ada Varn born</search>", "<answer>Oslen</answer>"])
    assert res.returncode == 0, res.stderr
    lines = res.stderr.splitlines()
    answer = next(line for line in lines if line.startswith("answer: "))
    assert "answer: Oslen" in answer and "finish=answer" in answer and "tokens=" in answer  # one line, unwrapped
    assert "evidence: 1 of the 2 passages read contains the answer:" in lines
    i = lines.index("evidence: 1 of the 2 passages read contains the answer:")
    assert lines[i + 1].split() == ["Ada", "Varn", "https://mini.example/wiki/Ada_Varn"]
    assert lines[i + 2].strip() == "> Ada Varn was born in Oslen."
    assert "Mercury" not in "\n".join(lines[i:])  # it was read, but does not hold the answer
    assert "SmolLM2" not in res.stderr  # the hint is for the default small model only


def test_an_answer_found_in_no_passage_is_said_so(tmp_path, tok_dir) -> None:
    res = _ask(tmp_path, tok_dir, ["<search>Ada Varn</search>", "<answer>Paris</answer>"])
    assert res.returncode == 0, res.stderr
    assert "evidence: the answer occurs in none of the 2 passages read; they were:" in res.stderr
    assert "Ada Varn" in res.stderr and "Mercury (planet)" in res.stderr


def test_no_answer_is_said_so_and_exits_0(tmp_path, tok_dir) -> None:
    res = _ask(tmp_path, tok_dir, ["<search>Ada Varn</search>"], "--max-turns", "2")
    assert res.returncode == 0, res.stderr
    assert "no answer: the episode ended with finish=max_turns" in res.stderr
    assert "evidence: the 2 passages read:" in res.stderr


def test_help_documents_every_style_and_the_engines_for_real_answers() -> None:
    from typer.testing import CliRunner

    from asearch.agent.styles import STYLES
    from asearch.cli.app import app

    out = " ".join(CliRunner().invoke(app, ["ask", "--help"], env={"COLUMNS": "400"}).output.split())
    assert all(name in out for name in STYLES) and "the default for smollm2-135m-instruct" in out
    assert "asearch engine serve" in out and "--engine openai --base-url URL --model NAME" in out
    agent_md = (Path(__file__).resolve().parents[2] / "docs" / "agent.md").read_text()
    assert all(f"| `{name}`" in agent_md for name in STYLES)
