"""How tool results read to the agent: search hits as `[Doc k](url):` blocks, pages as numbered chunks.

These strings are part of what a trained model learned to read; change them only on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asearch.retrieval.base import SearchHit


def render_search(
    hits: Sequence[SearchHit],
    query: str,
    *,
    max_doc_chars: int,
    show_urls: bool = True,
    compact: bool = False,
) -> str:
    """`[Doc k](url):` (`[Doc k]:` without urls) on its own line, then the passage contents (title line
    + text) cut at `max_doc_chars`; blocks separated by a blank line. No hits -> a sentence that says so.

    `compact`: one line per hit, `[Doc k] text`, without the quoted title line, for pages whose text
    names their subject. Every word then follows a space, as in the question, so a byte-level BPE
    gives a name the same tokens everywhere (after a quote or a newline its first word is another token).
    """
    if not hits:
        return f"No search results were found for the query {query!r}."
    headers = [f"[Doc {k}]" + (f"({h.passage.url})" if show_urls else "") for k, h in enumerate(hits, 1)]
    if compact:
        return "\n".join(
            f"{head} {h.passage.text[:max_doc_chars]}" for head, h in zip(headers, hits, strict=True)
        )
    return "\n\n".join(
        f"{head}:\n{h.passage.contents[:max_doc_chars]}" for head, h in zip(headers, hits, strict=True)
    )


def page_marker(k: int, n: int, url: str) -> str:
    """The first line of every page chunk: `[page k/n of <url>]`."""
    return f"[page {k}/{n} of {url}]"


@dataclass(frozen=True, slots=True)
class PageChunks:
    """A page cut for reading: `chunks` are the marked texts the agent reads one per turn."""

    chunks: list[str]
    total_chars: int
    shown_chars: int

    @property
    def truncated(self) -> bool:
        return self.shown_chars < self.total_chars

    @property
    def dropped_chars(self) -> int:
        return self.total_chars - self.shown_chars


def chunk_page(contents: str, url: str, *, chunk_chars: int, max_chunks: int, at_lines: bool = False) -> PageChunks:
    """Split `contents` into consecutive pieces of at most `chunk_chars` characters, keep at most `max_chunks`,
    and prefix each with its marker. If text was dropped, the last chunk ends with a note that says how much.

    `at_lines`: a piece ends after the last line break in its second half when it has one, so a line (a
    fact, a paragraph's last sentence) is not cut in two; otherwise pieces are exactly `chunk_chars` long."""
    spans = _spans(contents, chunk_chars, at_lines)[:max_chunks] or [(0, 0)]
    n = len(spans)
    # a piece cut after a line break does not show the break itself
    texts = [contents[a:b].rstrip("\n") if at_lines else contents[a:b] for a, b in spans]
    chunks = [f"{page_marker(k, n, url)}\n{text}" for k, text in enumerate(texts, 1)]
    shown_chars = spans[-1][1]
    if not contents:
        chunks[0] += "(this page is empty)"
    if shown_chars < len(contents):
        chunks[-1] += (
            f"\n[page cut: showing the first {shown_chars:,} of {len(contents):,} characters; "
            f"the remaining {len(contents) - shown_chars:,} were dropped (at most {max_chunks} pages "
            f"of {chunk_chars:,} characters are shown)]"
        )
    return PageChunks(chunks=chunks, total_chars=len(contents), shown_chars=shown_chars)


def _spans(contents: str, chunk_chars: int, at_lines: bool) -> list[tuple[int, int]]:
    """(start, end) of each consecutive piece of `contents` (see `chunk_page`)."""
    spans, start = [], 0
    while start < len(contents):
        end = min(start + chunk_chars, len(contents))
        if at_lines and end < len(contents):
            newline = contents.rfind("\n", start + chunk_chars // 2, end)
            end = newline + 1 if newline >= 0 else end
        spans.append((start, end))
        start = end
    return spans


def render_page_not_found(url: str) -> str:
    return f"The page {url} is not in the corpus; access can only open urls that search returned."


def render_page_read_to_end(url: str, page_count: int) -> str:
    """Paging (`access.chunks_per_call`) past a page's last chunk."""
    return f"[{url} has no page {page_count + 1}: all {page_count} pages were shown]"
