"""Long-horizon episode rows from hand-built trajectories, their jsonl round trip, and their statistics
against numbers worked out by hand."""

from __future__ import annotations

import pytest

from asearch.agent.trajectory import Trajectory, Turn
from asearch.eval.horizon import (
    episode_row,
    horizon_stats,
    horizon_summary,
    read_episode_rows,
    turn_bin,
    write_episode_rows,
)
from asearch.eval.records import QARecord


def turns(*kinds_actions: str) -> list[Turn]:
    """Turns from "search", "access", "answer" (act turns) and "read" (a reading turn)."""
    return [
        Turn(kind="read", output_text="note") if k == "read" else Turn(kind="act", output_text="", action=k)
        for k in kinds_actions
    ]


def episode(qid: str, hops: int | None, score: float | None, steps: list[Turn], finish="answer", **counters):
    traj = Trajectory(id=f"t-{qid}", question="?", style="ascii", turns=steps, score=score, finish=finish,
                      counters=counters)  # fmt: skip
    record = QARecord(id=qid, question="?", golds=["x"], metadata={} if hops is None else {"hops": hops})
    return traj, record


# five held-out episodes: 2 correct (one without opening a page), hops 1, 1, 2, 4, 6
EPISODES = [
    episode("a", 1, 1.0, turns("search", "answer"), searches=1),
    episode("b", 2, 0.0, turns("search", "access", "read", "read", "answer"),
            searches=1, accesses=1, read_turns=2, compactions=1),  # fmt: skip
    episode("c", 4, 1.0, turns("search", "access", *["read"] * 8, "access", "answer"),
            searches=1, accesses=2, read_turns=8, compactions=3, parse_errors=1),  # fmt: skip
    episode("d", 6, None, turns("search", "access", *["read"] * 29), finish="max_turns",
            searches=1, accesses=1, read_turns=29),  # fmt: skip  (no "compactions" counter: counts 0)
    episode("e", 1, 0.0, turns("answer")),
]


def rows() -> list[dict]:
    return [episode_row(t, r) for t, r in EPISODES]


def test_episode_row_counts_turns_by_kind_and_reads_counters():
    c = rows()[2]
    assert c == {
        "id": "c", "hops": 4, "score": 1.0, "correct": True, "finish": "answer", "turns": 12, "act_turns": 4,
        "read_turns": 8, "searches": 1, "accesses": 2, "compactions": 3, "parse_errors": 1, "used_access": True,
    }  # fmt: skip
    d = rows()[3]
    assert (d["correct"], d["score"], d["compactions"], d["turns"], d["read_turns"]) == (False, None, 0, 31, 29)
    assert rows()[0]["used_access"] is False and rows()[1]["correct"] is False
    no_hops = episode_row(*episode("z", None, 0.5, turns("answer")))
    assert no_hops["hops"] is None and no_hops["correct"] is False  # a partial score is not correct


def test_rows_round_trip_through_jsonl(tmp_path):
    path = tmp_path / "heldout_after.jsonl"
    assert write_episode_rows(path, rows()) == 5
    assert read_episode_rows(path) == rows()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # atomic: no temp file left


def test_stats_on_hand_computed_numbers():
    s = horizon_stats(rows())
    assert s["episodes"] == 5 and s["accuracy"] == pytest.approx(2 / 5)
    assert s["mean_turns"] == pytest.approx((2 + 5 + 12 + 31 + 1) / 5)
    assert s["mean_act_turns"] == pytest.approx((2 + 3 + 4 + 2 + 1) / 5)
    assert s["mean_read_turns"] == pytest.approx((0 + 2 + 8 + 29 + 0) / 5)
    assert s["mean_searches"] == pytest.approx(4 / 5)
    assert s["mean_accesses"] == pytest.approx((0 + 1 + 2 + 1 + 0) / 5)
    assert s["mean_compactions"] == pytest.approx((0 + 1 + 3 + 0 + 0) / 5)
    assert s["mean_parse_errors"] == pytest.approx(1 / 5)
    assert s["turn_histogram"] == {"0-4": 2, "5-9": 1, "10-14": 1, "15-19": 0, "20-29": 0, "30-49": 1, "50+": 0}
    assert s["compaction_histogram"] == {"0": 3, "1": 1, "3": 1}
    assert s["accuracy_by_hops"] == {
        "1": {"n": 2, "acc": 0.5}, "2": {"n": 1, "acc": 0.0}, "4": {"n": 1, "acc": 1.0}, "6": {"n": 1, "acc": 0.0},
    }  # fmt: skip
    assert s["access_rate_correct"] == pytest.approx(1 / 2)  # "a" answered without a page, "c" opened two
    assert s["share_4plus_hops"] == pytest.approx(2 / 5)


def test_stats_edge_cases():
    empty = horizon_stats([])
    assert empty["episodes"] == 0 and empty["mean_turns"] is None and empty["accuracy"] is None
    assert set(empty["turn_histogram"].values()) == {0} and empty["accuracy_by_hops"] == {}
    wrong_only = horizon_stats(rows()[1:2] + rows()[3:])
    assert wrong_only["access_rate_correct"] is None  # no correct episode to ask about
    unknown = [episode_row(*episode("z", None, 1.0, turns("answer"))), rows()[2]]
    s = horizon_stats(unknown)
    assert s["accuracy_by_hops"] == {"4": {"n": 1, "acc": 1.0}} and s["share_4plus_hops"] == 1.0
    assert [turn_bin(n) for n in (0, 4, 5, 19, 20, 29, 30, 49, 50, 400)] == [
        "0-4", "0-4", "5-9", "15-19", "20-29", "20-29", "30-49", "30-49", "50+", "50+",
    ]  # fmt: skip


def test_summary_entries_for_the_demo():
    after, before = rows(), rows()[:2]
    out = horizon_summary(after, before)
    assert out["horizon"] == horizon_stats(after) and out["horizon_before"] == horizon_stats(before)
    assert out["heldout_mean_turns_after"] == pytest.approx(51 / 5)
    assert out["heldout_access_rate_correct"] == pytest.approx(0.5)
    assert "horizon_before" not in horizon_summary(after)
