"""Parse one action from a model turn; anything malformed becomes a correction the agent reads.

Rules: exactly one complete action tag among the allowed ones; tags balanced; a turn cut by the
length limit with no action, an unknown/forbidden action, or two actions are all parse errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ACTION_TAGS = ("search", "access", "answer")
_TAG = re.compile(r"<(/?)(search|access|answer|think|summary)>", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Action:
    kind: str | None  # search | access | answer | None on error
    argument: str = ""
    error: str | None = None  # why the turn could not be parsed (the correction text says what to do)


def parse_action(text: str, allowed: tuple[str, ...] = ACTION_TAGS) -> Action:
    """Return the single action in `text`, or an Action with `error` set explaining the mistake."""
    opened: dict[str, int] = {}
    found: list[tuple[str, str]] = []
    depth_error = None
    for m in _TAG.finditer(text):
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
            if tag in ACTION_TAGS:
                found.append((tag, text[start : m.start()].strip()))
    if depth_error:
        return Action(None, error=f"unbalanced tags: {depth_error}")
    unclosed = [t for t in opened if t in ACTION_TAGS]
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
        return Action(None, error=f"<{kind}> is empty: put the {_what(kind)} between the tags")
    return Action(kind, arg)


def _fmt(allowed: tuple[str, ...]) -> str:
    return ", ".join(f"<{a}>...</{a}>" for a in allowed)


def _what(kind: str) -> str:
    return {"search": "query", "access": "url", "answer": "answer"}.get(kind, "argument")
