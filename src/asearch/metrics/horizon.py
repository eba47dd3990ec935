"""Long-horizon statistics of evaluated episodes: how many turns, tool calls, reading turns and compactions
an episode takes, and accuracy by the question's hop count.

The input is one compact row per episode (`asearch.eval.horizon.episode_row` makes them from trajectories).
This module is pure (no agent code) so that the viewer, which may only read files, computes the same
numbers from `heldout_after.jsonl` as the demo's report does from the trajectories.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from asearch.files import iter_jsonl

__all__ = ["FOUR_PLUS_HOPS", "PER_EPISODE_MEANS", "TURN_BINS", "horizon_stats", "read_episode_rows", "turn_bin"]

# (label, lowest, highest) of the turn-count histogram; None: no upper end. An episode that ended before
# its first LLM call (0 turns) counts in the first bin.
TURN_BINS: tuple[tuple[str, int, int | None], ...] = (
    ("0-4", 0, 4),
    ("5-9", 5, 9),
    ("10-14", 10, 14),
    ("15-19", 15, 19),
    ("20-29", 20, 29),
    ("30-49", 30, 49),
    ("50+", 50, None),
)
FOUR_PLUS_HOPS = 4
MEAN_COUNTS = ("turns", "act_turns", "read_turns", "searches", "accesses", "compactions", "parse_errors")
# (label, key of `horizon_stats`) of the per-episode means the report and the viewer show
PER_EPISODE_MEANS = (
    ("turns", "mean_turns"),
    ("searches", "mean_searches"),
    ("accesses", "mean_accesses"),
    ("reading turns", "mean_read_turns"),
    ("compactions", "mean_compactions"),
)


def turn_bin(turns: int) -> str:
    """The label of the histogram bin that `turns` falls in."""
    for label, _low, high in TURN_BINS:
        if high is None or turns <= high:
            return label
    raise AssertionError("the last bin has no upper end")


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def _count(row: Mapping[str, Any], key: str) -> int:
    """A per-episode count; a row without it (an older producer) counts 0."""
    value = row.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def accuracy_by_hops(rows: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """{hops as a string: {"n": episodes, "acc": share correct}} in hop order; rows without hops are left out.

    Keys are strings so the dict reads back from summary.json unchanged."""
    by_hops: dict[int, list[bool]] = {}
    for r in rows:
        if isinstance(r.get("hops"), int):
            by_hops.setdefault(r["hops"], []).append(bool(r.get("correct")))
    return {str(h): {"n": len(c), "acc": sum(c) / len(c)} for h, c in sorted(by_hops.items())}


def horizon_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Summary of episode rows (an empty list gives zeros and None):

    episodes               number of rows
    accuracy               share of episodes answered correctly (score 1.0)
    mean_turns             LLM calls per episode, reading turns included
    mean_act_turns, mean_read_turns
                           per episode: turns that acted (search, access, answer) / that read a page chunk
    mean_searches, mean_accesses, mean_compactions, mean_parse_errors
                           per episode: tool calls, times old reading blocks were cut from the context,
                           turns whose output did not parse
    turn_histogram         {bin label of TURN_BINS: episodes}, every bin in order, empty ones as 0
    compaction_histogram   {compactions as a string: episodes}, ascending
    accuracy_by_hops       see `accuracy_by_hops`
    access_rate_correct    share of the correct episodes that opened a page (None: no correct episode)
    share_4plus_hops       share of the episodes with a known hop count whose question has 4+ hops
                           (None: no row has one)
    """
    out: dict[str, Any] = {"episodes": len(rows), "accuracy": _share([bool(r.get("correct")) for r in rows])}
    for key in MEAN_COUNTS:
        out[f"mean_{key}"] = _mean([_count(r, key) for r in rows])
    histogram = Counter(turn_bin(_count(r, "turns")) for r in rows)
    out["turn_histogram"] = {label: histogram[label] for label, _, _ in TURN_BINS}
    compactions = Counter(_count(r, "compactions") for r in rows)
    out["compaction_histogram"] = {str(n): compactions[n] for n in sorted(compactions)}
    out["accuracy_by_hops"] = accuracy_by_hops(rows)
    out["access_rate_correct"] = _share([bool(r.get("used_access")) for r in rows if r.get("correct")])
    hops = [r["hops"] for r in rows if isinstance(r.get("hops"), int)]
    out["share_4plus_hops"] = _share([h >= FOUR_PLUS_HOPS for h in hops])
    return out


def read_episode_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a file `asearch.eval.horizon.write_episode_rows` wrote (DataFormatError on a bad line)."""
    return [row for _, row in iter_jsonl(path)]
