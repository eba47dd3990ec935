"""How the counters tools publish (`searches`, `accesses`, `finds`, ...) are shown beside the scores: the eval
report and the viewer read a summary's stats through this one function, so a new tool's counter shows up in
both without an edit (and the viewer loads no eval code to show it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LEGACY_TOOL_COUNTERS = ("searches", "accesses")  # the stats of summaries written before tools published theirs


def tool_calls_text(stats: Mapping[str, Any], digits: int = 1) -> str:
    """`searches 2.1, accesses 0.4`: the mean calls of every tool a summary's stats hold."""
    names = stats.get("tool_counters", [c for c in LEGACY_TOOL_COUNTERS if c in stats])
    return ", ".join(f"{c} {'–' if stats.get(c) is None else f'{stats[c]:.{digits}f}'}" for c in names) or "–"
