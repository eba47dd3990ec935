"""The demo run's long-horizon section: held-out episode rows (heldout_after.jsonl, heldout_before.jsonl)
shown as a turn histogram, means per episode, accuracy by hop count and compactions per episode."""

from __future__ import annotations

import shutil
import subprocess
import sys

import httpx
import pytest

from asearch.eval.horizon import write_episode_rows
from asearch.retrieval.server import serve_in_thread
from asearch.view import ViewConfig, create_app
from asearch.view.pages import run_details
from asearch.view.runs import Catalog, DemoRun


def row(hops: int, correct: bool, turns: int, *, accesses: int = 0, read_turns: int = 0, compactions: int = 0):
    """An episode row as `asearch.eval.horizon.episode_row` writes it."""
    return {
        "id": f"q{hops}-{turns}", "hops": hops, "score": float(correct), "correct": correct, "finish": "answer",
        "turns": turns, "act_turns": turns - read_turns, "read_turns": read_turns, "searches": 2,
        "accesses": accesses, "compactions": compactions, "parse_errors": 0, "used_access": accesses > 0,
    }  # fmt: skip


BEFORE = [row(1, True, 2), row(2, False, 7, accesses=1, read_turns=3)]
AFTER = [
    row(1, True, 3, accesses=1, read_turns=1),
    row(2, True, 12, accesses=2, read_turns=8, compactions=1),
    row(5, False, 41, accesses=3, read_turns=30, compactions=4),
]


@pytest.fixture
def demo(runs_root, tmp_path):
    """The viewer fixtures' demo run, copied, with held-out episode rows after RL."""
    path = tmp_path / "runs" / "demo-seed0"
    shutil.copytree(runs_root / "demo-seed0", path)
    write_episode_rows(path / "heldout_after.jsonl", AFTER)
    return path


def demo_run(root) -> DemoRun:
    run = next(r for r in Catalog([root]).all() if r.kind == "demo")
    assert isinstance(run, DemoRun)
    return run


def test_demo_run_computes_the_stats_of_its_rows(demo):
    run = demo_run(demo)
    horizon = run.horizon()
    assert horizon is not None and horizon["before"] is None
    after = horizon["after"]
    assert after["episodes"] == 3 and after["mean_turns"] == pytest.approx(56 / 3)
    assert after["mean_compactions"] == pytest.approx(5 / 3) and after["compaction_histogram"] == {"0": 1, "1": 1, "4": 1}
    assert after["turn_histogram"]["0-4"] == 1 and after["turn_histogram"]["10-14"] == 1
    assert after["turn_histogram"]["30-49"] == 1
    html = run_details(run)
    assert "Long horizon: 3 held-out episodes" in html and "before RL" not in html
    assert "<tr><td>reading turns</td><td>13</td></tr>" in html  # (1 + 8 + 30) / 3
    assert "<tr><td>5</td><td>0 (n=1)</td></tr>" in html
    assert "<tr><td>4</td><td>1</td></tr>" in html  # one episode with 4 compactions

    write_episode_rows(demo / "heldout_before.jsonl", BEFORE)
    html = run_details(demo_run(demo))
    assert "<th>before RL</th><th>after RL</th>" in html
    assert "<tr><td>5-9</td><td>1</td><td>0</td></tr>" in html
    assert "<tr><td>1</td><td>1 (n=1)</td><td>1 (n=1)</td></tr>" in html
    assert "<tr><td>5</td><td>–</td><td>0 (n=1)</td></tr>" in html


def test_demo_without_rows_has_no_section_and_a_bad_file_is_reported(demo):
    (demo / "heldout_after.jsonl").unlink()
    run = demo_run(demo)
    assert run.horizon() is None and "Long horizon" not in run_details(run)
    (demo / "heldout_after.jsonl").write_text('{"turns": 3}\n{"turns": \n')
    run.refresh()
    assert run.horizon() is None
    bad, problems = run.bad_lines()
    assert bad == 1 and "heldout_after.jsonl" in problems[0] and "heldout_after.jsonl:2:" in problems[0]


def test_overview_page_shows_the_section_and_the_plot(demo):
    pytest.importorskip("matplotlib")
    from asearch.demo.report import write_horizon_plot
    from asearch.metrics.horizon import horizon_stats

    write_horizon_plot(demo / "horizon.png", None, horizon_stats(AFTER))
    with serve_in_thread(create_app([demo.parent], ViewConfig())) as url:
        with httpx.Client(base_url=url, timeout=10) as client:
            page = client.get("/").text
            assert "Long horizon: 3 held-out episodes" in page and "compactions per episode" in page
            assert 'src="/file/demo-seed0/horizon.png"' in page
            png = client.get("/file/demo-seed0/horizon.png")
            assert png.status_code == 200 and png.content.startswith(b"\x89PNG")


def test_the_viewer_loads_no_agent_or_training_code():
    code = (
        "import sys, asearch.view, asearch.view.pages, asearch.metrics.horizon\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[:2] in (['asearch', p] for p in "
        "('agent', 'rl', 'launch', 'tools', 'engine', 'eval')))\n"
        "assert not bad, bad"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
