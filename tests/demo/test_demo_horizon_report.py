"""The demo report's long-horizon section and horizon.png: present only when the summary has "horizon",
numbers as `horizon_stats` gives them, identical when the summary was read back from summary.json."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from asearch.demo.report import write_horizon_plot, write_report
from asearch.metrics.horizon import horizon_stats

CFG = SimpleNamespace(  # the keys write_report reads from DemoConfig
    hops=(1, 2, 3, 4, 5, 6),
    rl=SimpleNamespace(tools=SimpleNamespace(search=SimpleNamespace(topk=5)), rollout=SimpleNamespace(max_staleness=4)),
)
SUMMARY = {
    "seed": 0, "parameters": 123456, "heldout_acc_before": 0.25, "heldout_acc_after": 0.5, "rl_wall_seconds": 100.0,
    "rl_steps": 10, "sft_seconds": 20.0, "wall_seconds": 150.0, "rejected_groups": 3,
}  # fmt: skip


def row(hops: int, correct: bool, turns: int, *, accesses: int = 0, read_turns: int = 0, compactions: int = 0):
    """An episode row as `asearch.eval.horizon.episode_row` writes it."""
    return {
        "id": f"q{hops}-{turns}", "hops": hops, "score": float(correct), "correct": correct, "finish": "answer",
        "turns": turns, "act_turns": turns - read_turns, "read_turns": read_turns, "searches": 1,
        "accesses": accesses, "compactions": compactions, "parse_errors": 0, "used_access": accesses > 0,
    }  # fmt: skip


BEFORE = [row(1, True, 2), row(1, False, 3), row(4, False, 6, accesses=1, read_turns=2)]
AFTER = [
    row(1, True, 3, accesses=1, read_turns=1),
    row(1, True, 2),
    row(4, True, 33, accesses=3, read_turns=26, compactions=4),
    row(6, False, 52, accesses=4, read_turns=40, compactions=6),
]


def report(tmp_path: Path, summary: dict) -> str:
    path = tmp_path / "report.md"
    write_report(path, summary, CFG)
    return path.read_text()


def test_report_without_horizon_is_the_plain_report(tmp_path):
    plain = report(tmp_path, SUMMARY)
    assert "| held-out accuracy after RL | 0.500 |" in plain
    assert "horizon" not in plain.lower() and plain.rstrip().endswith("`model-sft/` (the supervised start).")


def test_report_with_horizon_adds_histogram_means_and_accuracy_by_hops(tmp_path):
    summary = {**SUMMARY, "horizon": horizon_stats(AFTER), "horizon_before": horizon_stats(BEFORE)}
    text = report(tmp_path, summary)
    assert text.startswith(report(tmp_path, SUMMARY))  # the plain report, then the section
    section = text[text.index("## Long horizon (4 held-out episodes)") :]
    assert "| heldout_mean_turns_after | 22.50 |" in section  # (3 + 2 + 33 + 52) / 4
    assert "| heldout_access_rate_correct | 0.667 |" in section  # 2 of the 3 correct opened a page
    assert "| share of 4+ hop questions | 0.500 |" in section
    assert "| turns | before RL | after RL |" in section
    assert "| 0-4 | 2 | 2 |" in section and "| 5-9 | 1 | 0 |" in section
    assert "| 30-49 | 0 | 1 |" in section and "| 50+ | 0 | 1 |" in section
    assert "| reading turns | 0.67 | 16.75 |" in section and "| compactions | 0.00 | 2.50 |" in section
    assert "| accesses | 0.33 | 2.00 |" in section
    assert "| 1 | 0.500 (n=2) | 1.000 (n=2) |" in section and "| 4 | 0.000 (n=1) | 1.000 (n=1) |" in section
    assert "| 6 | – | 0.000 (n=1) |" in section and "(horizon.png)" in section
    # the same report from summary.json (its hop keys were strings all along)
    assert report(tmp_path, json.loads(json.dumps(summary))) == text


def test_report_after_only_has_one_column(tmp_path):
    text = report(tmp_path, {**SUMMARY, "horizon": horizon_stats(AFTER)})
    assert "| turns | after RL |" in text and "before RL |" not in text.split("## Long horizon")[1]


def test_horizon_plot_is_a_png_with_or_without_before(tmp_path):
    pytest.importorskip("matplotlib")
    for name, before in (("both.png", horizon_stats(BEFORE)), ("after.png", None)):
        write_horizon_plot(tmp_path / name, before, horizon_stats(AFTER))
        assert (tmp_path / name).read_bytes().startswith(b"\x89PNG")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["after.png", "both.png"]  # no temp file left
