"""The access tool: 25,000-character chunks, the 10-chunk cap with its note, unknown and messy urls."""

from __future__ import annotations

import asyncio

import pytest

from asearch.corpus.types import Page
from asearch.retrieval.client import RetrievalClient
from asearch.retrieval.server import create_app, serve_in_thread
from asearch.tools import AccessTool, AccessToolConfig, EpisodeContext, run_tool


class DictPages:
    """A dict-backed PageStore (test scaffolding)."""

    def __init__(self, pages: list[Page]):
        self.by_url = {p.url: p for p in pages}
        self.asked: list[str] = []

    def get(self, url: str) -> Page | None:
        self.asked.append(url)
        return self.by_url.get(url)

    def __len__(self) -> int:
        return len(self.by_url)


class NoSearch:
    name = "none"

    def search(self, queries, topk):
        return [[] for _ in queries]


def text_of(n: int, seed: str) -> str:
    """n characters whose every position is distinguishable, so a misplaced cut shows."""
    unit = "".join(f"{seed}{i:07d}|" for i in range(n // 9 + 1))
    return unit[:n]


BIG = Page(url="https://w.test/Big", title="Big", contents=text_of(260_000, "b"))
MID = Page(url="https://w.test/Mid", title="Mid", contents=text_of(60_000, "m"))
EMPTY = Page(url="https://w.test/Empty", title="Empty", contents="")
PAGES = [BIG, MID, EMPTY]


def run(coro):
    return asyncio.run(coro)


def body(chunk: str) -> str:
    return chunk.split("\n", 1)[1]


def test_page_under_the_cap_is_split_into_marked_chunks():
    obs = run(run_tool(AccessTool(DictPages(PAGES)), MID.url))
    chunks = obs.metadata["chunks"]
    assert [c.split("\n", 1)[0] for c in chunks] == [f"[page {k}/3 of {MID.url}]" for k in (1, 2, 3)]
    assert [len(body(c)) for c in chunks] == [25_000, 25_000, 10_000]
    assert "".join(body(c) for c in chunks) == MID.contents  # nothing lost, nothing added
    assert obs.text == "\n\n".join(chunks)
    assert obs.metadata["truncated"] is False and obs.metadata["dropped_chars"] == 0
    assert obs.metadata["title"] == "Mid" and obs.metadata["found"] is True and obs.error is None


def test_page_over_the_cap_keeps_10_chunks_and_says_what_was_dropped():
    obs = run(run_tool(AccessTool(DictPages(PAGES)), BIG.url))
    chunks = obs.metadata["chunks"]
    assert len(chunks) == 10 and obs.metadata["page_count"] == 10
    assert chunks[0].startswith(f"[page 1/10 of {BIG.url}]\n") and chunks[9].startswith(
        f"[page 10/10 of {BIG.url}]\n"
    )
    assert all(len(body(c)) == 25_000 for c in chunks[:9])
    last_text, note = body(chunks[9]).split("\n[page cut:", 1)
    assert len(last_text) == 25_000
    assert "".join(body(c) for c in chunks[:9]) + last_text == BIG.contents[:250_000]
    assert "first 250,000 of 260,000 characters" in note and "remaining 10,000 were dropped" in note
    assert "[page cut:" in obs.text
    assert obs.metadata["truncated"] is True and obs.metadata["dropped_chars"] == 10_000
    assert obs.metadata["total_chars"] == 260_000


def test_chunk_size_and_cap_are_configurable():
    tool = AccessTool(DictPages(PAGES), AccessToolConfig(chunk_chars=7_000, max_chunks=2))
    chunks = run(run_tool(tool, MID.url)).metadata["chunks"]
    assert [len(body(c).split("\n[page cut:")[0]) for c in chunks] == [7_000, 7_000]
    assert "remaining 46,000 were dropped" in chunks[1]


def test_empty_page_is_one_chunk_that_says_so():
    obs = run(run_tool(AccessTool(DictPages(PAGES)), EMPTY.url))
    assert obs.metadata["chunks"] == [f"[page 1/1 of {EMPTY.url}]\n(this page is empty)"]


def test_unknown_url_is_an_observation_not_an_error():
    obs = run(run_tool(AccessTool(DictPages(PAGES)), "https://w.test/Nowhere"))
    assert obs.text.startswith("The page https://w.test/Nowhere is not in the corpus")
    assert obs.error is None and obs.metadata["found"] is False and obs.metadata["chunks"] == []


@pytest.mark.parametrize(
    "raw",
    [
        f"  {MID.url}  ",
        f"<{MID.url}>",
        f"{MID.url}/",
        f'"{MID.url}"',
        f"`<{MID.url}/>`",
        f"{MID.url}#Section_2",
        f'{{"url": "{MID.url}"}}',
    ],
)
def test_urls_are_normalised_before_lookup(raw):
    obs = run(run_tool(AccessTool(DictPages(PAGES)), raw))
    assert obs.metadata["found"] is True and obs.metadata["url"] == MID.url, obs.text


def test_store_without_trailing_slash_variant_is_found_from_the_other_side():
    slashed = Page(url="https://w.test/dir/", title="Dir", contents="inside")
    store = DictPages([slashed])
    obs = run(run_tool(AccessTool(store), "https://w.test/dir"))
    assert obs.metadata["found"] is True
    assert store.asked == ["https://w.test/dir", "https://w.test/dir/"]


@pytest.mark.parametrize("raw", ["", "  <>  ", '{"link": "x"}'])
def test_missing_url_is_a_bad_argument(raw):
    obs = run(run_tool(AccessTool(DictPages(PAGES)), raw))
    assert obs.metadata["error"] == "bad_arguments" and obs.text.startswith("access failed: ")


def test_remote_backend_gives_the_same_chunks():
    store = DictPages(PAGES)
    local = run(run_tool(AccessTool(store), f"<{BIG.url}/>"))
    with serve_in_thread(create_app(NoSearch(), store)) as url:
        remote = run(run_tool(AccessTool(RetrievalClient(url, timeout=5)), f"<{BIG.url}/>"))
        missing = run(run_tool(AccessTool(RetrievalClient(url, timeout=5)), "https://w.test/Nowhere"))
    assert remote.metadata["chunks"] == local.metadata["chunks"] and remote.text == local.text
    assert missing.metadata["found"] is False and "not in the corpus" in missing.text


def test_description_is_its_line_in_the_prompt():
    assert AccessTool(DictPages(PAGES)).description == "<access>url</access> shows the full page at a url"


def test_the_page_shown_is_recorded_in_the_episode():
    episode = EpisodeContext()
    run(run_tool(AccessTool(DictPages(PAGES)), MID.url, episode=episode))
    run(run_tool(AccessTool(DictPages(PAGES)), "https://w.test/Nowhere", episode=episode))  # not found: not a page
    assert [p.url for p in episode.pages] == [MID.url] and episode.last_page == MID


LINES = Page(url="https://w.test/Lines", title="Lines", contents="\n".join(f"line {i:02d} " + "x" * 20 for i in range(12)))


def test_chunks_end_at_line_breaks_so_no_line_is_cut_in_two():
    cfg = AccessToolConfig(chunk_chars=100)
    chunks = run(run_tool(AccessTool(DictPages([LINES]), cfg), LINES.url)).metadata["chunks"]
    bodies = [body(c) for c in chunks]
    assert all(len(b) <= 100 for b in bodies) and len(bodies) == 4
    assert "\n".join(bodies) == LINES.contents  # every line whole, in order, nothing lost
    exact = run(run_tool(AccessTool(DictPages([LINES]), AccessToolConfig(chunk_chars=100, cut_at_lines=False)), LINES.url))
    assert [len(body(c)) for c in exact.metadata["chunks"]][:3] == [100, 100, 100]  # the character cut cuts lines


def test_paging_shows_one_chunk_per_call_and_goes_on_where_it_stopped():
    tool = AccessTool(DictPages([LINES, MID]), AccessToolConfig(chunk_chars=100, chunks_per_call=1))
    episode = EpisodeContext()
    shown = [run(run_tool(tool, LINES.url, episode=episode)).metadata for _ in range(4)]
    assert [m["chunks"][0].split("\n", 1)[0] for m in shown] == [f"[page {k}/4 of {LINES.url}]" for k in (1, 2, 3, 4)]
    assert [m["first_chunk"] for m in shown] == [0, 1, 2, 3]
    past = run(run_tool(tool, LINES.url, episode=episode))
    assert past.error is None and past.text == f"[{LINES.url} has no page 5: all 4 pages were shown]"
    # another page starts at its first chunk; another episode starts afresh
    assert run(run_tool(tool, MID.url, episode=episode)).metadata["first_chunk"] == 0
    assert run(run_tool(tool, LINES.url, episode=EpisodeContext())).metadata["first_chunk"] == 0
