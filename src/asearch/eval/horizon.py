"""Per-episode rows of a long-horizon evaluation (turns, tool calls, reading turns, compactions, hops) and
their statistics.

The demo writes one row per held-out episode to RUN/heldout_after.jsonl (and heldout_before.jsonl); the
report and the viewer summarise them with `horizon_stats`, which lives in `asearch.metrics.horizon` so the
viewer can import it without agent code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asearch.agent.trajectory import Trajectory
from asearch.eval.records import QARecord
from asearch.files import write_jsonl
from asearch.metrics.horizon import TURN_BINS, horizon_stats, read_episode_rows, turn_bin

__all__ = [
    "TURN_BINS",
    "episode_row",
    "horizon_stats",
    "horizon_summary",
    "read_episode_rows",
    "turn_bin",
    "write_episode_rows",
]


def episode_row(traj: Trajectory, record: QARecord) -> dict[str, Any]:
    """One episode in a few numbers. `correct`: the answer metric is 1.0 (exact match); counters the
    trajectory does not have count 0; `hops` is None when the question does not say."""
    counters = traj.counters
    accesses = counters.get("accesses", 0)
    return {
        "id": record.id,
        "hops": record.metadata.get("hops"),
        "score": traj.score,
        "correct": traj.score is not None and traj.score >= 1.0,
        "finish": traj.finish,
        "turns": traj.num_turns,
        "act_turns": sum(1 for t in traj.turns if t.kind == "act"),
        "read_turns": sum(1 for t in traj.turns if t.kind == "read"),
        "searches": counters.get("searches", 0),
        "accesses": accesses,
        "compactions": counters.get("compactions", 0),
        "parse_errors": counters.get("parse_errors", 0),
        "used_access": accesses > 0,
    }


def write_episode_rows(path: str | Path, rows: list[dict[str, Any]]) -> int:
    """Write the rows as jsonl, atomically; returns how many."""
    return write_jsonl(path, rows)


def horizon_summary(after: list[dict[str, Any]], before: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The summary.json entries of the held-out rows after RL (and before): what `write_report` shows.

    "horizon" / "horizon_before" are `horizon_stats` of each; the two flat keys repeat the headline numbers."""
    stats = horizon_stats(after)
    out: dict[str, Any] = {
        "horizon": stats,
        "heldout_mean_turns_after": stats["mean_turns"],
        "heldout_access_rate_correct": stats["access_rate_correct"],
    }
    if before is not None:
        out["horizon_before"] = horizon_stats(before)
    return out
