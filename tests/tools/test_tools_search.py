"""The search tool: exact rendering, the 5,000-character cut, no-results text, both backends, batching."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Sequence

import pytest

from asearch.corpus.types import Page, Passage
from asearch.retrieval.base import SearchHit
from asearch.retrieval.client import RetrievalClient
from asearch.retrieval.server import create_app, serve_in_thread
from asearch.tools import LocalSearchBackend, SearchTool, SearchToolConfig, run_tool

# --------------------------------------------------------------------------- scaffolding (not the product)


class OverlapRetriever:
    """Scores a passage by how many query words it shares; ties go to the lower index. Records calls."""

    name = "overlap"

    def __init__(self, passages: list[Passage], delay_s: float = 0.0):
        self.passages, self.delay_s = passages, delay_s
        self._tok = [set(re.findall(r"[a-z0-9]+", (p.title + " " + p.text).lower())) for p in passages]
        self.calls: list[int] = []

    def search(self, queries: Sequence[str], topk: int) -> list[list[SearchHit]]:
        self.calls.append(len(queries))
        if self.delay_s:
            time.sleep(self.delay_s)
        out = []
        for q in queries:
            qt = set(re.findall(r"[a-z0-9]+", q.lower()))
            scored = sorted(((len(qt & t), i) for i, t in enumerate(self._tok)), key=lambda s: (-s[0], s[1]))
            out.append([SearchHit(self.passages[i], float(s)) for s, i in scored[:topk] if s > 0])
        return out


class NoPages:
    def get(self, url: str) -> Page | None:
        return None

    def __len__(self) -> int:
        return 0


LONG = " ".join(f"word{i}" for i in range(2000))  # ~15,000 characters: must be cut
PASSAGES = [
    Passage(id="0", title="Long Read", text="volcano " + LONG, url="https://w.test/Long_Read"),
    Passage(id="1", title="Short", text="a volcano erupts", url="https://w.test/Short"),
    Passage(id="2", title="Other", text="about rivers", url="https://w.test/Other"),
]


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------- rendering


def test_rendering_is_exact_with_the_5000_char_cut():
    tool = SearchTool(OverlapRetriever(PASSAGES))
    obs = run(run_tool(tool, "volcano"))
    long_contents = f'"Long Read"\nvolcano {LONG}'
    expected = (
        f"[Doc 1](https://w.test/Long_Read):\n{long_contents[:5000]}\n\n"
        '[Doc 2](https://w.test/Short):\n"Short"\na volcano erupts'
    )
    assert obs.text == expected
    assert len(long_contents) > 5000 and obs.error is None
    assert obs.metadata["hit_count"] == 2
    assert obs.metadata["urls"] == ["https://w.test/Long_Read", "https://w.test/Short"]
    assert obs.metadata["ids"] == ["0", "1"] and obs.metadata["scores"] == [1.0, 1.0]
    assert obs.metadata["latency_s"] >= 0


def test_topk_and_cut_are_configurable():
    tool = SearchTool(OverlapRetriever(PASSAGES), SearchToolConfig(topk=1, max_doc_chars=13))
    obs = run(run_tool(tool, "volcano"))
    assert obs.text == '[Doc 1](https://w.test/Long_Read):\n"Long Read"\nv'


def test_urls_can_be_left_out():
    cfg = SearchToolConfig(topk=2, max_doc_chars=13, show_urls=False)
    tool = SearchTool(OverlapRetriever(PASSAGES), cfg)
    obs = run(run_tool(tool, "volcano"))
    assert obs.text == '[Doc 1]:\n"Long Read"\nv\n\n[Doc 2]:\n"Short"\na vol'
    assert obs.metadata["urls"] == ["https://w.test/Long_Read", "https://w.test/Short"]  # still recorded
    assert "urls" not in tool.description  # the prompt does not promise them


def test_compact_results_are_one_line_each_without_the_title_line():
    cfg = SearchToolConfig(topk=2, max_doc_chars=13, show_urls=False, compact=True)
    tool = SearchTool(OverlapRetriever(PASSAGES), cfg)
    obs = run(run_tool(tool, "volcano"))
    assert obs.text == f"[Doc 1] {PASSAGES[0].text[:13]}\n[Doc 2] a volcano eru"  # no quoted title line


def test_no_results_says_so_with_the_query():
    obs = run(run_tool(SearchTool(OverlapRetriever(PASSAGES)), "glaciers"))
    assert obs.text == "No search results were found for the query 'glaciers'."
    assert obs.error is None and obs.metadata["hit_count"] == 0 and obs.metadata["urls"] == []


@pytest.mark.parametrize(
    ("raw", "query"),
    [("  volcano  ", "volcano"), ('"volcano erupts"', "volcano erupts"), ('{"query": " rivers "}', "rivers")],
)
def test_parse_accepts_plain_quoted_and_json(raw, query):
    assert SearchTool(OverlapRetriever(PASSAGES)).parse(raw).query == query


@pytest.mark.parametrize(
    ("raw", "needle"),
    [("   ", "empty"), ('""', "empty"), ('{"q": "x"}', '"query" string'), ("x" * 2001, "2001 characters")],
)
def test_bad_arguments_become_observations(raw, needle):
    retriever = OverlapRetriever(PASSAGES)
    obs = run(run_tool(SearchTool(retriever), raw))
    assert obs.error is not None and needle in obs.text and obs.text.startswith("search failed: ")
    assert obs.metadata["error"] == "bad_arguments"
    assert retriever.calls == []  # the retriever never ran


# --------------------------------------------------------------------------- backends


def test_remote_backend_renders_the_same_as_in_process():
    retriever = OverlapRetriever(PASSAGES)
    local = run(run_tool(SearchTool(retriever), "volcano rivers"))
    with serve_in_thread(create_app(retriever, NoPages())) as url:
        remote = run(run_tool(SearchTool(RetrievalClient(url, timeout=5)), "volcano rivers"))
    assert remote.text == local.text and remote.metadata["urls"] == local.metadata["urls"]
    assert local.metadata["hit_count"] == 3


def test_in_process_backend_batches_concurrent_agents():
    retriever = OverlapRetriever(PASSAGES, delay_s=0.05)
    tool = SearchTool(LocalSearchBackend(retriever, batch_window_ms=5))
    queries = ["volcano", "rivers", "short", "erupts", "long read", "about"] * 4

    async def agents():
        return await asyncio.gather(*(run_tool(tool, q) for q in queries))

    got = run(agents())
    assert sum(retriever.calls) == len(queries) and len(retriever.calls) < len(queries)
    reference = SearchTool(OverlapRetriever(PASSAGES))
    for q, obs in zip(queries, got, strict=True):
        assert obs.text == run(run_tool(reference, q)).text


def test_remote_server_down_is_an_observation():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tool = SearchTool(RetrievalClient(f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01))
    obs = run(run_tool(tool, "volcano"))
    assert obs.metadata["error"] == "remote" and obs.text.startswith("search failed: ")
    assert "ConnectError" in obs.text


def test_description_is_its_line_in_the_prompt():
    # byte for byte the line the asearcher prompt had before prompts were rendered from the tools
    assert SearchTool(OverlapRetriever(PASSAGES)).description == (
        "<search>keywords</search> searches the encyclopedia and shows the top passages with their urls"
    )
