"""`run_eval(cfg)`, the eval job as a library call: built-in world questions, BM25 over the embedded world,
a scripted engine; what the command writes, without the command."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from asearch.eval.job import EvalRunConfig, run_eval
from asearch.eval.runner import read_results

WORLD = "world:seed=1000,entities=300"


def _config(tok_dir: Path, out: Path, **eval_keys: object) -> EvalRunConfig:
    replies = ["<search> capital</search>", "<answer> nowhere</answer>"]  # one real search, then a wrong answer
    return EvalRunConfig.model_validate({
        "engine": {"kind": "scripted", "model": str(tok_dir), "replies": replies},
        "tools": {"corpus": WORLD}, "agent": {"style": "search-r1"},
        "eval": {"datasets": ["world:n=3,entities=300"], "out": str(out), **eval_keys},
    })  # fmt: skip


def test_run_eval_evaluates_writes_and_resumes(tmp_path, tok_dir) -> None:
    out = tmp_path / "run"
    cfg = _config(tok_dir, out)
    job = run_eval(cfg)
    assert job.run_dir == out and len(job.records) == 3 and job.summary is not None
    assert (job.summary.written, job.summary.resumed, job.summary.failed) == (3, 0, 0)
    rows = read_results(out / "results.jsonl")
    assert sorted(r["id"] for r in rows) == sorted(r.id for r in job.records)
    assert all(r["em"] == 0.0 for r in rows)  # "nowhere" is no world's answer
    assert json.loads((out / "summary.json").read_text())["overall"]["n"] == 3
    resolved = yaml.safe_load((out / "eval_config.yaml").read_text())
    assert resolved["agent"]["temperature"] == 0.0  # k=1: greedy, filled in on the job's own copy
    assert "temperature" not in cfg.agent.model_fields_set  # the caller's config is left as it was
    assert any((out / "tool-record").iterdir())  # the search really ran, and was recorded

    again = run_eval(cfg)
    assert again.summary is not None and (again.summary.written, again.summary.resumed) == (0, 3)


def test_run_eval_without_questions_runs_nothing(tmp_path, tok_dir) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = _config(tok_dir, tmp_path / "run")
    cfg.eval.datasets = [str(empty)]
    job = run_eval(cfg, allow_empty=True)
    assert job.summary is None and job.records == [] and not (tmp_path / "run").exists()
