"""`asearch train` with `workflow.kind=openai_agent`: the example agent (written only against the `openai`
client) trains for a few steps on the tiny world in a real subprocess, its held-out evaluation included, and
every episode it logged is a token-exact trajectory of its completions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
AGENT = f"{ROOT / 'examples' / 'openai_agent' / 'search_agent.py'}:agent"


@pytest.fixture(scope="module")
def tools_model(save_world_model, tmp_path_factory) -> Path:
    """The tiny world model with a chat template that renders tools (`CHATML_TOOLS_TEMPLATE`)."""
    from asearch.engine.chat_tools import CHATML_TOOLS_TEMPLATE
    from asearch.models.loading import load_tokenizer

    path = save_world_model(tmp_path_factory.mktemp("tools") / "model", hidden=32, heads=2, max_positions=1024)
    tok = load_tokenizer(path)
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    tok.save_pretrained(path)
    return path


@pytest.mark.slow
def test_train_runs_an_openai_client_agent(tools_model, train_command, subprocess_env, tmp_path) -> None:
    out = tmp_path / "run"
    cmd = [
        *train_command(tools_model, out, 3), "corpus_from_data=false", "agent.max_new_tokens=24",
        "engine.max_seq_len=1024", "agent.max_context_tokens=1024",  # the tools' system prompt is ~500 tokens
        "heldout.dataset=world:seed=1,entities=200,n=4",
        "workflow.kind=openai_agent", f"workflow.agent={AGENT}",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["heldout_acc_final"] is not None
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert all("rollout/prompt_mismatches" in m for m in metrics if "rollout/reward_mean" in m)
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert trajs
    for row in trajs:
        t = row.get("trajectory", row)
        assert t["style"] == "openai_agent" and t["counters"]["llm_calls"] == len(t["turns"]) >= 1
        generated = sum(sum(s["loss_mask"]) for s in t["segments"])
        assert generated == t["counters"]["generated_tokens"] == sum(turn["output_tokens"] for turn in t["turns"])


@pytest.mark.slow
def test_eval_runs_an_openai_client_agent(tools_model, subprocess_env, tmp_path) -> None:
    out = tmp_path / "eval"
    cmd = [
        sys.executable, "-m", "asearch", "eval", "-d", "world:seed=1,entities=200,n=3", "--out", str(out), "--no-progress",
        "engine.kind=inprocess", f"engine.model={tools_model}", "tools.corpus=world:seed=1,entities=200",
        "agent.max_new_tokens=8", "workflow.kind=openai_agent", f"workflow.agent={AGENT}",
    ]  # fmt: skip
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(r["trajectory"]["style"] == "openai_agent" for r in rows)
    assert all(1 <= r["trajectory"]["turns"][0]["output_tokens"] <= 8 for r in rows)  # capped by agent.max_new_tokens
