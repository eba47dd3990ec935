"""Parse one action from a model turn; anything malformed becomes a correction the agent reads.

The action tags come from the tools: an agent's tags are its tools' names plus `answer`
(`action_tags(tools)`). Rules: exactly one complete action tag among the allowed ones; tags
balanced; a turn cut by the length limit with no action, an unknown/forbidden action, or two actions
are all parse errors.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from asearch.tools import Tool, argument_hints, tool_argument_hint

ANSWER = "answer"
_STYLE_TAGS = ("think", "summary")  # not actions, but kept balanced like them


@dataclass(frozen=True, slots=True)
class Action:
    kind: str | None  # a tool's name, "answer", or None on error
    argument: str = ""
    error: str | None = None  # why the turn could not be parsed (the correction text says what to do)


def action_tags(tools: Mapping[str, Tool[Any]]) -> dict[str, str]:
    """Every action tag an agent with `tools` reads -> what goes between its tags: its tools (in order),
    `answer`, then the other registered tools, which it may not use: `<find>` from an agent without
    `find` is "not available here", which tells the model more than "no action"."""
    tags = {name: tool_argument_hint(tool) for name, tool in tools.items()}
    tags[ANSWER] = "answer"
    for name, hint in argument_hints().items():
        tags.setdefault(name, hint)
    return tags


@functools.lru_cache(maxsize=64)
def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(t) for t in (*tags, *_STYLE_TAGS))
    return re.compile(rf"<(/?)({names})>", re.IGNORECASE)


def parse_action(text: str, allowed: Sequence[str], tags: Mapping[str, str] | None = None) -> Action:
    """Return the single action in `text`, or an Action with `error` set explaining the mistake.

    `allowed`: the tags this turn may use, in the order the correction lists them. `tags`: every action
    tag the agent reads, with what goes between its tags (`action_tags(tools)`; default: every registered
    tool's and `answer`); one of them outside `allowed` is "not available here".
    """
    hints = {tag.lower(): hint for tag, hint in (action_tags({}) if tags is None else tags).items()}
    for tag in allowed:
        hints.setdefault(tag.lower(), "argument")
    opened: dict[str, int] = {}
    found: list[tuple[str, str]] = []
    depth_error = None
    for m in _tag_pattern(tuple(sorted(hints))).finditer(text):
        closing, tag = m.group(1) == "/", m.group(2).lower()
        if not closing:
            if tag in opened:
                depth_error = f"<{tag}> opened twice without </{tag}>"
            opened[tag] = m.end()
        else:
            if tag not in opened:
                depth_error = f"</{tag}> without a matching <{tag}>"
                continue
            start = opened.pop(tag)
            if tag in hints:
                found.append((tag, text[start : m.start()].strip()))
    if depth_error:
        return Action(None, error=f"unbalanced tags: {depth_error}")
    unclosed = [t for t in opened if t in hints]
    if unclosed:
        return Action(None, error=f"unbalanced tags: <{unclosed[0]}> is never closed")
    if not found:
        return Action(None, error="no action: end your turn with exactly one of " + _fmt(allowed))
    if len(found) > 1:
        return Action(None, error="more than one action in one turn: use exactly one of " + _fmt(allowed))
    kind, arg = found[0]
    if kind not in allowed:
        return Action(None, error=f"<{kind}> is not available here: use one of " + _fmt(allowed))
    if not arg:
        return Action(None, error=f"<{kind}> is empty: put the {hints[kind]} between the tags")
    return Action(kind, arg)


def _fmt(allowed: Sequence[str]) -> str:
    return ", ".join(f"<{a}>...</{a}>" for a in allowed)
