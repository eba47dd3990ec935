"""Synthesised questions feed the eval runner, `asearch eval` and `asearch train` as they are (no conversion)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

CORPUS = "world:seed=5,entities=300"  # the corpus of the graph_questions fixture (conftest.py)


def test_the_eval_runner_scores_a_searching_agent_on_them(graph_questions, char_tokenizer, tmp_path):
    from asearch.agent import AgentConfig
    from asearch.engine.local.scripted import ScriptedEngine
    from asearch.eval import agent_solver, evaluate, load_dataset
    from asearch.tools import ToolsConfig, build_tools

    records = load_dataset(graph_questions)
    assert len(records) >= 20 and all(r.metadata["corpus"] == CORPUS for r in records)
    gold = {r.question: r.golds[0] for r in records}
    tools, _ = build_tools(ToolsConfig(corpus=CORPUS), progress=False)
    searched: list[str] = []

    def policy(prompt: str) -> str:
        """Search once with the question, then answer right on every other question (by its position)."""
        question = re.findall(r"Question: (.*)", prompt)[-1].strip()
        after = prompt.split(f"Question: {question}")[-1]
        if "<information>" not in after:
            return f"<search>{question}</search>"
        searched.append(after)
        i = list(gold).index(question)
        return f"<answer>{gold[question] if i % 2 == 0 else 'wrong'}</answer>"

    tok = char_tokenizer
    agent = AgentConfig(style="search-r1", max_turns=4, max_new_tokens=200, max_context_tokens=100_000)
    summary = evaluate(
        agent_solver(ScriptedEngine(tok, policy), tok, tools, agent),
        records,
        out_dir=tmp_path,
        progress=False,
    )
    expected = sum(1 for i in range(len(records)) if i % 2 == 0) / len(records)
    assert summary.metric("questions", "em") == pytest.approx(expected)
    # the search tool really searched the synthesised questions' world
    assert len(searched) == len(records) and all("world5.example" in s for s in searched)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory, make_tokenizer, make_tiny_model) -> Path:
    """A random tiny model that knows the tags and a few words, saved as a model directory."""
    from asearch.models.tiny import save_tiny

    tok = make_tokenizer([f"<search>question {i}</search> <answer>city {i}</answer> Velmo Purno" for i in range(200)], 400)
    return save_tiny(make_tiny_model(tok, max_positions=2048), tok, tmp_path_factory.mktemp("model") / "tiny")


def test_asearch_eval_reads_the_file(graph_questions, tiny_model, tmp_path):
    from asearch.cli.app import app

    result = CliRunner().invoke(
        app,
        ["eval", "-d", str(graph_questions), "--out", str(tmp_path), "--no-progress", f"tools.corpus={CORPUS}",
         f"engine.model={tiny_model}", "agent.max_turns=2", "agent.max_new_tokens=8", "engine.inprocess.threads=1"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    assert len(lines) == sum(1 for _ in graph_questions.open())
    assert {json.loads(line)["dataset"] for line in lines} == {"questions"}
    assert "warning" not in result.output  # the corpus the records name is the one searched


@pytest.mark.timeout(300)
def test_asearch_train_takes_the_file(graph_questions, tiny_model, tmp_path):
    from asearch.cli.app import app

    cfg = {
        "model": str(tiny_model),
        "data": str(graph_questions),
        "steps": 1,
        "tools": {"corpus": CORPUS},
        "agent": {"max_turns": 2, "max_new_tokens": 8, "max_context_tokens": 1024},
        "rollout": {"batch_size": 1, "group_size": 2, "max_concurrent": 2, "drop_zero_variance": False},
        "checkpoint_every": 1,
    }
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    result = CliRunner().invoke(app, ["train", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 1
