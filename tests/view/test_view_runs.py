"""Run discovery and reading: kinds from files, live eval summaries, outcomes, and the curves' metric names."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from asearch.errors import AsearchError
from asearch.files import iter_jsonl, write_jsonl
from asearch.runs import RunDir
from asearch.view.pages import CHARTS
from asearch.view.records import outcome_of, row_of
from asearch.view.runs import Catalog, EvalRun, TrainRun


def kinds(catalog: Catalog) -> dict[str, str]:
    return {r.name: r.kind for r in catalog.all()}


def test_finds_every_kind_under_a_directory(runs_root):
    catalog = Catalog([runs_root])
    assert kinds(catalog) == {
        "ask.json": "trajectories",
        "demo-seed0": "demo",
        "demo-seed0/rl": "train",
        "eval-mini": "eval",
        "synth": "synth",
    }
    train = next(r for r in catalog.all() if isinstance(r, TrainRun))
    rows = RunDir(runs_root / "demo-seed0" / "rl", tensorboard=False).metrics()
    assert train.rows == rows and len(rows) == 7
    n_traj = sum(1 for _ in iter_jsonl(runs_root / "demo-seed0" / "rl" / "trajectories.jsonl"))
    assert train.counts() == {"metric_rows": 7, "last_step": 6, "trajectories": n_traj}
    assert "rollout/rejected/stale" in train.keys
    demo = next(r for r in catalog.all() if r.kind == "demo")
    assert demo.images() == ["curve.png"] and demo.info(60)["state"] == "finished"
    assert train.info(3600)["state"] == "running"  # no summary.json yet, files fresh


def test_files_and_run_dirs_named_directly(runs_root, tmp_path):
    assert kinds(Catalog([runs_root / "eval-mini" / "results.jsonl"])) == {"eval-mini": "eval"}
    assert kinds(Catalog([runs_root / "demo-seed0" / "rl"])) == {"rl": "train"}
    assert kinds(Catalog([runs_root / "ask.json"])) == {"ask.json": "trajectories"}

    one = json.loads((runs_root / "ask.json").read_text())
    many = tmp_path / "asks.jsonl"
    write_jsonl(many, [one, {**one, "id": "second", "question": "Where is Oslen?"}])
    plain = tmp_path / "questions.jsonl"  # plain QA lines count as synth output only when named
    write_jsonl(plain, [{"question": "Where is Oslen?", "answer": "Tarnia"}])
    (tmp_path / "notes.txt").write_text("not a run")
    appended = tmp_path / "appended.json"  # `asearch ask --json >> appended.json`, twice
    appended.write_text("".join(json.dumps({**one, "id": i}) + "\n" for i in ("a", "b")))
    catalog = Catalog([many, plain, runs_root / "ask.json", appended])
    assert kinds(catalog) == {
        "asks.jsonl": "trajectories",
        "questions.jsonl": "synth",
        "ask.json": "trajectories",
        "appended.json": "trajectories",
    }
    assert [r.id for r in next(r for r in catalog.all() if r.name == "appended.json").trajectory_rows()] == [
        "a",
        "b",
    ]
    traj = next(r for r in catalog.all() if r.name == "asks.jsonl")
    assert [row.question for row in traj.trajectory_rows()] == [one["question"], "Where is Oslen?"]
    assert traj.open_trajectory(1)["id"] == "second"

    empty = Catalog([tmp_path / "notes.txt"])
    assert empty.runs == {} and empty.empty_roots == [tmp_path / "notes.txt"]
    with pytest.raises(AsearchError, match="no such file"):
        Catalog([tmp_path / "missing"])


def test_a_run_that_starts_later_is_found(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    catalog = Catalog([root])
    assert catalog.runs == {} and catalog.empty_roots == [root]
    RunDir(root / "exp1", tensorboard=False).log(1, {"rollout/reward_mean": 0.5})
    catalog.refresh(force=True)
    assert kinds(catalog) == {"exp1": "train"} and catalog.empty_roots == []
    (run,) = catalog.all()
    assert isinstance(run, TrainRun) and run.rows[0]["rollout/reward_mean"] == 0.5


def test_outcomes_judge_then_em_then_training_score(runs_root):
    results = [obj for _, obj in iter_jsonl(runs_root / "eval-mini" / "results.jsonl")]
    rows = [row_of(i, r) for i, r in enumerate(results)]
    assert [r.outcome for r in rows] == ["correct" if r["em"] == 1.0 else "wrong" for r in results]
    assert {r.outcome for r in rows} == {"correct", "wrong"}
    assert [(r.dataset, r.pass_index, r.turns) for r in rows] == [
        (r["dataset"], r["pass"], r["num_turns"]) for r in results
    ]
    wrong_em = {**results[0], "em": 0.0}
    assert outcome_of(wrong_em["trajectory"], {**wrong_em, "judge": {"correct": True}}) == ("correct", 1.0)
    assert outcome_of(wrong_em["trajectory"], {**wrong_em, "judge": {"correct": None}}) == ("wrong", 0.0)

    train = [obj for _, obj in iter_jsonl(runs_root / "demo-seed0" / "rl" / "trajectories.jsonl")]
    outcomes = [row_of(i, t).outcome for i, t in enumerate(train)]
    assert outcomes == ["correct" if t["score"] == 1.0 else "wrong" for t in train]
    assert row_of(0, {"question": "q", "turns": []}).outcome == "unscored"
    assert row_of(0, {"question": "q", "turns": [], "metadata": {"score": 1.0}}).outcome == "correct"  # older runs


def _without_timing(summary: dict) -> dict:
    s = json.loads(json.dumps(summary))
    s.pop("other_results", None)
    for group in [*s["datasets"].values(), s["overall"]]:
        group.pop("timing", None)
    return s


def test_live_eval_summary_matches_the_runner(runs_root, tmp_path):
    final = json.loads((runs_root / "eval-mini" / "summary.json").read_text())
    out = tmp_path / "eval"
    shutil.copytree(runs_root / "eval-mini", out)
    (out / "summary.json").unlink()
    lines = (out / "results.jsonl").read_text().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:4]))  # the eval is still running

    run = EvalRun("e", out, "eval")
    run.refresh()
    partial, source = run.summary()
    started = {(r["dataset"], r["id"]) for r in map(json.loads, lines[:4])}
    assert source == "live" and partial["overall"]["n"] + partial["overall"]["incomplete"] == len(started)
    with open(out / "results.jsonl", "a") as f:
        f.writelines(lines[4:])
    run.refresh()
    live, source = run.summary()
    assert source == "live"
    assert _without_timing(live) == _without_timing(final)  # the same numbers the runner writes at the end
    shutil.copy(runs_root / "eval-mini" / "summary.json", out / "summary.json")
    assert run.summary() == (final, "summary.json")


def test_bad_and_torn_lines_in_a_growing_run(tmp_path):
    run_dir = RunDir(tmp_path / "r", tensorboard=False)
    run_dir.log(1, {"rollout/reward_mean": 0.1})
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write("{oops\n")
    run_dir.log(2, {"rollout/reward_mean": 0.2})
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "rollout/rew')  # torn: being written
    run = TrainRun("r", tmp_path / "r", "r")
    run.refresh()
    assert [r["step"] for r in run.rows] == [1, 2]
    n, problems = run.bad_lines()
    assert n == 1 and problems[0].startswith(f"{tmp_path / 'r' / 'metrics.jsonl'}:2:")
    assert run.info(60)["bad_lines"] == 1
    with open(tmp_path / "r" / "metrics.jsonl", "a") as f:
        f.write('ard_mean": 0.3}\n')
    run.refresh()
    assert [r["step"] for r in run.rows] == [1, 2, 3] and run.rows[-1]["rollout/reward_mean"] == 0.3


def test_chart_metric_names_are_written_by_the_trainer():
    """Every curve the overview draws names a metric that asearch.rl writes (read from the source: no torch import)."""
    (rl_dir,) = importlib.util.find_spec("asearch.rl").submodule_search_locations
    source = "\n".join(p.read_text() for p in Path(rl_dir).glob("*.py"))
    keys = [k for chart in CHARTS for k in chart.keys]
    assert len(keys) >= 15
    missing = [k for k in keys if f'"{k}' not in source]
    assert missing == [], f"charts name metrics asearch.rl does not write: {missing}"
