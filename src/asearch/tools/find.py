"""The `find` tool: find a phrase in the last page the agent accessed, like a browser's find-in-page.

An agent reading a long page one chunk at a time can jump to the part it needs: `<find>born in</find>`
shows every match (up to `max_matches`) with `context_chars` characters on each side, numbered, with its
character position in the page. Matching ignores case and treats any run of whitespace as one space.
The page is the last one `access` opened in this episode (`EpisodeContext.pages`), searched whole,
including any part the page cut dropped. Off by default: turn it on with `tools.find={}`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from asearch.config import Config
from asearch.corpus.types import Page
from asearch.tools.base import EpisodeContext, Observation, ToolArgumentError, ToolSources, argument_text
from asearch.tools.registry import register_tool


class FindToolConfig(Config):
    """How `find` shows the matches of a phrase in the last accessed page."""

    context_chars: int = Field(
        200, ge=0, description="Characters of page text shown on each side of a match."
    )
    max_matches: int = Field(
        5, ge=1, description="Matches shown, in page order; the observation states how many more there are."
    )
    max_phrase_chars: int = Field(200, ge=1, description="Longer phrases are refused with an observation.")


@dataclass(frozen=True, slots=True)
class FindArgs:
    phrase: str


def _pattern(phrase: str) -> re.Pattern[str]:
    """The phrase, case-insensitive, with any whitespace run matching any other (a page's line breaks)."""
    return re.compile(r"\s+".join(re.escape(word) for word in phrase.split()), re.IGNORECASE)


def _passage(text: str, start: int, end: int, context_chars: int) -> str:
    """The match with `context_chars` on each side, on one line; `...` where the page goes on."""
    left, right = max(0, start - context_chars), min(len(text), end + context_chars)
    body = " ".join(text[left:right].split())
    return ("..." if left > 0 else "") + body + ("..." if right < len(text) else "")


@register_tool
class FindTool:
    """`find`: the argument is the phrase (or `{"phrase": "..."}`); searches the last accessed page."""

    name = "find"
    argument_hint = "phrase"
    counter = "finds"
    order = 30
    config_class = FindToolConfig
    enabled_by_default = False

    def __init__(self, config: FindToolConfig | dict[str, Any] | None = None):
        self.config = (
            config if isinstance(config, FindToolConfig) else FindToolConfig.model_validate(config or {})
        )

    @classmethod
    def from_sources(cls, sources: ToolSources, config: FindToolConfig) -> FindTool:
        return cls(config)  # it reads the pages the episode's `access` calls opened, not a backend

    @property
    def description(self) -> str:
        return "<find>phrase</find> shows where a phrase occurs in the page you accessed last"

    def parse(self, raw: str) -> FindArgs:
        text = argument_text(raw, "phrase", self.name)
        if not text:
            raise ToolArgumentError("the phrase to find is empty")
        if len(text) > self.config.max_phrase_chars:
            raise ToolArgumentError(
                f"the phrase has {len(text)} characters; the limit is {self.config.max_phrase_chars}"
            )
        return FindArgs(phrase=" ".join(text.split()))

    async def call(self, args: FindArgs, episode: EpisodeContext) -> Observation:
        start = time.perf_counter()
        page = episode.last_page
        matches = list(_pattern(args.phrase).finditer(page.contents)) if page is not None else []
        shown = matches[: self.config.max_matches]
        return Observation(
            text=self._render(args.phrase, page, len(matches), shown),
            metadata={
                "tool": self.name,
                "phrase": args.phrase,
                "url": page.url if page is not None else None,
                "match_count": len(matches),
                "positions": [m.start() for m in shown],
                "latency_s": round(time.perf_counter() - start, 6),
            },
        )

    def _render(self, phrase: str, page: Page | None, n: int, shown: list[re.Match[str]]) -> str:
        if page is None:
            return f"No page to search for {phrase!r}: open one with access first, then find in it."
        if n == 0:
            return f"No match for {phrase!r} in {page.url}."
        more = f"; showing the first {len(shown)}" if len(shown) < n else ""
        blocks = [
            f"[match {k}/{n} at character {m.start():,} of {len(page.contents):,}]\n"
            + _passage(page.contents, m.start(), m.end(), self.config.context_chars)
            for k, m in enumerate(shown, 1)
        ]
        return "\n\n".join([f"{n} match{'es' if n > 1 else ''} for {phrase!r} in {page.url}{more}:", *blocks])
