"""`find`: a phrase in the last page the episode accessed, like a browser's find-in-page; on in config only."""

from __future__ import annotations

import asyncio
import re

import pytest

from asearch.agent import AgentConfig, run_episode
from asearch.corpus.types import Document, Page
from asearch.engine.local.scripted import ScriptedEngine
from asearch.retrieval.index import IndexConfig, build_index
from asearch.tools import EpisodeContext, ToolsConfig, build_tools, run_tool
from asearch.tools.find import FindTool

FILLER = "The town keeps records of its families. " * 30  # 1,200 characters before the fact
LONG = Page(
    url="https://mini.example/wiki/Ada_Varn",
    title="Ada Varn",
    contents=f"Ada Varn is a chemist.\n{FILLER}Ada Varn was born in\nOslen. Later ADA VARN moved to Kettering.",
)


def run(coro):
    return asyncio.run(coro)


def find(phrase: str, *pages: Page, **config) -> str:
    return run(run_tool(FindTool(config), phrase, episode=EpisodeContext(pages=list(pages)))).text


# --------------------------------------------------------------------------- the tool


def test_matches_are_numbered_with_position_and_context_ignoring_case_and_line_breaks():
    obs = run(run_tool(FindTool({"context_chars": 10}), "ada varn", episode=EpisodeContext(pages=[LONG])))
    first, second, third = (LONG.contents.index(s) for s in ("Ada Varn is", "Ada Varn was", "ADA VARN"))
    assert obs.ok and obs.metadata["match_count"] == 3 and obs.metadata["positions"] == [first, second, third]
    n = len(LONG.contents)
    assert obs.text == (
        f"3 matches for 'ada varn' in {LONG.url}:\n\n"
        f"[match 1/3 at character 0 of {n:,}]\nAda Varn is a chem...\n\n"
        f"[match 2/3 at character {second:,} of {n:,}]\n...families. Ada Varn was born...\n\n"
        f"[match 3/3 at character {third:,} of {n:,}]\n...en. Later ADA VARN moved to..."
    )
    # the phrase's space matches the page's line break, and the shown passage is on one line
    assert "born in Oslen." in find("born in oslen", LONG)


def test_only_max_matches_are_shown_and_the_rest_counted():
    text = find("records", LONG, max_matches=2)
    assert text.startswith(f"30 matches for 'records' in {LONG.url}; showing the first 2:")
    assert "[match 2/30 at" in text and "[match 3/30" not in text


def test_the_last_accessed_page_is_searched():
    other = Page(url="https://mini.example/wiki/Oslen", title="Oslen", contents="Oslen is a city in Tarnia.")
    assert "in https://mini.example/wiki/Oslen" in find("city", LONG, other)
    assert find("chemist", LONG, other) == "No match for 'chemist' in https://mini.example/wiki/Oslen."


def test_no_page_yet_says_what_to_do():
    obs = run(run_tool(FindTool(), "born"))
    assert obs.ok and obs.text == "No page to search for 'born': open one with access first, then find in it."
    assert obs.metadata["url"] is None and obs.metadata["match_count"] == 0


@pytest.mark.parametrize(
    ("raw", "phrase"),
    [(' "born  in" ', "born in"), ('{"phrase": "born in"}', "born in"), ("a.b*c", "a.b*c")],
)
def test_arguments(raw, phrase):
    assert FindTool().parse(raw).phrase == phrase


def test_bad_arguments_are_observations():
    assert run(run_tool(FindTool(), "  ")).text == "find failed: the phrase to find is empty"
    long = run(run_tool(FindTool({"max_phrase_chars": 5}), "born in"))
    assert long.metadata["error"] == "bad_arguments" and "the limit is 5" in long.text
    assert find("a.b*c", Page(url="u", title="", contents="xx a.b*c yy axbbc")).startswith("1 match for")


# --------------------------------------------------------------------------- in an agent, from config


class _Source:
    name = "find-mini"

    def documents(self):
        yield Document(id="0", title=LONG.title, text=LONG.contents, url=LONG.url)
        yield Document(
            id="1", title="Oslen", text="Oslen is a city in Tarnia.", url="https://mini.example/wiki/Oslen"
        )

    def pages(self):
        for d in self.documents():
            yield Page(url=d.url, title=d.title, contents=d.text)

    def fingerprint(self):
        return "find-mini-v1"


def researcher(prompt: str) -> str:
    """Search, open Doc 1, find the phrase the page cut dropped, answer from the match."""
    if prompt.endswith("<summary>"):  # a reading turn: note what the block says
        block = prompt.rsplit("<information>", 1)[1]
        if "[match " in block and (m := re.search(r"born in (\w+)", block)):  # only what find showed
            return f"Born in {m.group(1)}.</summary>"
        if m := re.search(r"\[Doc 1\]\((\S+?)\):", block):
            return f"Doc 1 is at {m.group(1)} .</summary>"
        return "Not here.</summary>"
    if m := re.findall(r"<summary>Born in (\w+)\.", prompt):
        return f"<answer>{m[-1]}</answer>"
    if "[page 1/" in prompt:
        return "<think>The page is long: find it.</think><find>born in</find>"
    if m := re.findall(r"<summary>Doc 1 is at (\S+) \.", prompt):
        return f"<access>{m[-1]}</access>"
    return "<search>Ada Varn</search>"


def test_an_agent_searches_accesses_and_finds(tmp_path, make_tokenizer):
    build_index(_Source(), tmp_path / "idx", IndexConfig(), progress=False)
    # pages of 400 characters, two shown: the birthplace, at character ~1,250, is cut from what access shows
    cfg = ToolsConfig(index=tmp_path / "idx", access={"chunk_chars": 400, "max_chunks": 2}, find={})
    tools, closers = build_tools(cfg, progress=False)
    assert list(tools) == ["search", "access", "find"]
    texts = [
        LONG.contents,
        "<search></search><access></access><find></find><answer></answer><summary></summary>",
    ]
    tok = make_tokenizer(texts * 20, vocab_size=400)
    prompts: list[str] = []

    def policy(prompt: str) -> str:
        prompts.append(prompt)
        return researcher(prompt)

    traj = run(
        run_episode(ScriptedEngine(tok, policy), tok, tools, "Where was Ada Varn born?", AgentConfig())
    )
    for close in closers:
        close()

    assert traj.answer == "Oslen" and traj.finish == "answer"
    assert [t.action for t in traj.turns if t.kind == "act"] == ["search", "access", "find", "answer"]
    assert traj.counters["searches"] == traj.counters["accesses"] == traj.counters["finds"] == 1
    assert traj.counters.get("tool_errors", 0) == traj.counters.get("parse_errors", 0) == 0
    assert "find" in traj.action_tags
    found = next(t for t in traj.turns if t.action == "find")
    assert found.observation.startswith(f"1 match for 'born in' in {LONG.url}:\n\n[match 1/1 at character")
    assert (
        "[page cut: showing the first 800" in next(t for t in traj.turns if t.action == "access").observation
    )
    # the prompt lists the tools from their descriptions, find included
    assert "<access>url</access> shows the full page at a url;\n<find>phrase</find> shows where" in prompts[0]
