"""`asearch eval` decodes greedily with one pass per question (unless the config sets a temperature), and
exits 1 when it scored nothing it was asked to; an empty dataset allowed with --allow-empty says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from asearch.cli.app import app

PAGES = [{"id": "ada", "title": "Ada Varn", "text": "Ada Varn was born in Oslen."}]
QUESTION = {"id": "q1", "question": "Where was Ada Varn born?", "golden_answers": ["Oslen"]}


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    (tmp_path / "pages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PAGES))
    (tmp_path / "qs.jsonl").write_text(json.dumps(QUESTION) + "\n")
    (tmp_path / "empty.jsonl").write_text("")
    return {name: tmp_path / f"{name}.jsonl" for name in ("pages", "qs", "empty")}


def _eval(tok_dir: Path, files: dict[str, Path], out: Path, *args: str):
    replies = json.dumps(["<search>Ada Varn</search>", "<answer>Oslen</answer>"])
    return CliRunner().invoke(app, [
        "eval", "--out", str(out), "--no-progress", "engine.kind=scripted", f"engine.model={tok_dir}",
        f"engine.replies={replies}", f"tools.corpus={files['pages']}", "agent.style=search-r1", *args,
    ])  # fmt: skip


def _temperature(out: Path) -> float:
    return yaml.safe_load((out / "eval_config.yaml").read_text())["agent"]["temperature"]


def test_one_pass_is_greedy_more_passes_sample(tmp_path, tok_dir, files) -> None:
    res = _eval(tok_dir, files, tmp_path / "k1", "-d", str(files["qs"]))
    assert res.exit_code == 0, res.output
    assert _temperature(tmp_path / "k1") == 0.0
    res = _eval(tok_dir, files, tmp_path / "k2", "-d", str(files["qs"]), "--k", "2")
    assert res.exit_code == 0, res.output
    assert _temperature(tmp_path / "k2") == 1.0  # AgentConfig's own default
    res = _eval(tok_dir, files, tmp_path / "set", "-d", str(files["qs"]), "agent.temperature=0.7")
    assert res.exit_code == 0, res.output
    assert _temperature(tmp_path / "set") == 0.7  # a temperature the user sets always wins


def test_nothing_scored_exits_1_with_the_reason(tmp_path, tok_dir, files) -> None:
    from asearch.eval.datasets import load_dataset
    from asearch.eval.runner import shard_records

    records = load_dataset(str(files["qs"]))
    empty_shard = next(i for i in range(2) if not shard_records(records, (i, 2)))
    res = _eval(tok_dir, files, tmp_path / "shard", "-d", str(files["qs"]), "--shard", f"{empty_shard}/2")
    assert res.exit_code == 1, res.output
    assert f"no question was scored: shard {empty_shard}/2 holds none of the 1 questions" in " ".join(res.output.split())


def test_an_allowed_empty_dataset_runs_nothing_and_says_so(tmp_path, tok_dir, files) -> None:
    out = tmp_path / "empty"
    res = _eval(tok_dir, files, out, "-d", str(files["empty"]), "--allow-empty")
    assert res.exit_code == 0, res.output
    assert "no questions to evaluate (--allow-empty): nothing was run" in res.output
    assert not out.exists()
