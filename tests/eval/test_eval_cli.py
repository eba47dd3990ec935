"""`asearch eval` and `asearch data` through typer, with the agent runtime swapped for a scripted one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from killable_eval import CharTokenizer
from typer.testing import CliRunner

from asearch.cli.eval import app, data_app
from asearch.errors import ConfigError

root = typer.Typer()
root.add_typer(app, name="eval")  # mounted the way the top-level app mounts it
root.add_typer(data_app, name="data")
runner = CliRunner()


@pytest.fixture
def scripted_runtime(monkeypatch):
    """build_runtime -> a ScriptedEngine that always answers "Paris"; records what it was asked to build."""
    import asearch.agent.runtime as rt
    from asearch.engine.local.scripted import ScriptedEngine

    built = []

    def build_runtime(cfg, *, progress=True, record_dir=None):
        built.append(cfg)
        tok = CharTokenizer()
        engine = ScriptedEngine(tok, lambda prompt: "<think>sure</think><answer>Paris</answer>")
        return rt.Runtime(engine, tok, {}, cfg.agent)

    monkeypatch.setattr(rt, "build_runtime", build_runtime)
    return built


@pytest.fixture
def data_dir(tmp_path):
    d = tmp_path / "data" / "capitals"
    d.mkdir(parents=True)
    rows = [
        {"id": "fr", "question": "Capital of France?", "golden_answers": ["Paris"]},
        {"id": "it", "question": "Capital of Italy?", "golden_answers": ["Rome"]},
        {"id": "tx", "question": "Capital of Texas?", "golden_answers": ["Austin"]},
        {"id": "fr2", "question": "Where is the Louvre?", "golden_answers": ["Paris, France", "Paris"]},
    ]
    (d / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "data"


def test_eval_runs_resumes_and_aggregates(tmp_path, data_dir, scripted_runtime):
    out = tmp_path / "out"
    args = ["eval", "-d", "capitals", "--data-dir", str(data_dir), "--out", str(out), "--k", "2", "--no-progress",
            "agent.style=search-r1", "agent.max_turns=2"]  # fmt: skip
    res = runner.invoke(root, args)
    assert res.exit_code == 0, res.output
    assert scripted_runtime[-1].agent.style == "search-r1" and scripted_runtime[-1].agent.max_turns == 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["k"] == 2
    em = summary["datasets"]["capitals"]["metrics"]["em"]["avg_at_k"]
    assert em["mean"] == pytest.approx(0.5)  # "Paris" is right for fr and fr2
    assert len((out / "results.jsonl").read_text().splitlines()) == 8
    resolved = (out / "eval_config.yaml").read_text()
    assert "agent:" in resolved and "eval:" in resolved
    assert "| capitals | 4 | 50.0" in res.output
    assert "0 resumed, 8 new, 0 failed" in res.output

    again = runner.invoke(root, args)
    assert again.exit_code == 0 and "8 resumed, 0 new" in again.output

    changed = runner.invoke(root, [*args[:-1], "agent.max_turns=3"])
    assert isinstance(changed.exception, ConfigError) and "agent.max_turns" in str(changed.exception)

    agg = runner.invoke(root, ["eval", "--aggregate-only", "--out", str(out)])
    assert agg.exit_code == 0 and "| capitals | 4 | 50.0" in agg.output


def test_eval_flags_and_config_file(tmp_path, data_dir, scripted_runtime):
    cfg = tmp_path / "eval.yaml"
    cfg.write_text(
        "agent:\n  style: search-r1\neval:\n  datasets: [capitals]\n  k: 3\n  limit: 2\n"
        f"  data_dir: {data_dir}\n  out: {tmp_path / 'o'}\n"
    )
    res = runner.invoke(root, ["eval", "-c", str(cfg), "--seeds", "5,6", "--no-progress"])
    assert res.exit_code == 0, res.output
    conf = json.loads((tmp_path / "o" / "config.json").read_text())
    assert conf["k"] == 2 and conf["seeds"] == [5, 6] and conf["datasets"] == {"capitals": 2}  # flags win
    bad = runner.invoke(root, ["eval", "-c", str(cfg), "eval.shard=3/2"])
    assert isinstance(bad.exception, ConfigError) and "3/2" in str(bad.exception)
    typo = runner.invoke(root, ["eval", "-c", str(cfg), "eval.kk=2"])
    assert isinstance(typo.exception, ConfigError) and "eval.k" in str(typo.exception)


def test_builtin_set_warns_when_the_tools_search_another_corpus(tmp_path, scripted_runtime):
    args = ["eval", "-d", "world:n=3,entities=300", "--no-progress", "agent.style=search-r1"]
    res = runner.invoke(root, [*args, "--out", str(tmp_path / "w")])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "about corpus world:seed=1000,entities=300 but the tools search wiki10k" in said
    ok = runner.invoke(
        root, [*args, "--out", str(tmp_path / "w2"), "tools.corpus=world:seed=1000,entities=300"]
    )
    assert ok.exit_code == 0 and "warning" not in ok.output


def test_data_commands(tmp_path, data_dir):
    res = runner.invoke(root, ["data", "show", "capitals", "--data-dir", str(data_dir), "-n", "2"])
    assert res.exit_code == 0 and "4 questions" in res.output and "Capital of Italy?" in res.output
    js = runner.invoke(root, ["data", "show", "wiki10k:n=2", "--json"])
    lines = [json.loads(x) for x in js.output.strip().splitlines()]
    assert len(lines) == 2 and all(x["dataset"] == "wiki10k:n=2" for x in lines)

    src = tmp_path / "bamboogle.jsonl"
    src.write_text(json.dumps({"Question": "Who?", "Answer": "Ada"}) + "\n")
    fetched = runner.invoke(root, ["data", "fetch", "bamboogle", "--out", str(data_dir), "--from", str(src)])
    assert fetched.exit_code == 0 and "wrote 1 questions" in fetched.output
    listing = runner.invoke(root, ["data", "list", "--data-dir", str(data_dir)])
    assert listing.exit_code == 0 and "bamboogle" in listing.output and "1 questions" in listing.output


def test_eval_config_rules():
    from asearch.config import load_config
    from asearch.eval.config import EvalConfig, default_out_dir

    assert load_config(EvalConfig, overrides=["seeds=[3, 4, 5]"]).k == 3
    with pytest.raises(ConfigError, match="k=2 but 3 seeds"):
        load_config(EvalConfig, overrides=["seeds=[3, 4, 5]", "k=2"])
    with pytest.raises(ConfigError, match="needs judge.engine.model"):
        load_config(EvalConfig, overrides=["judge.url=http://127.0.0.1:8001/v1"])
    assert default_out_dir(["world:hops=2", "data/my set.jsonl"]) == Path("runs/eval/world_hops=2+my_set")


def test_eval_with_a_judge_on_loopback(tmp_path, data_dir, scripted_runtime):
    from fastapi import FastAPI

    from asearch.retrieval.server import serve_in_thread

    chat = FastAPI()
    asked = []

    @chat.post("/v1/chat/completions")
    async def completions(body: dict):
        asked.append(body)
        user = body["messages"][-1]["content"]
        verdict = "correct" if "- Paris" in user else "incorrect"  # the agent always says Paris
        text = json.dumps({"rationale": "scripted", "judgement": verdict})
        return {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
            ]
        }

    with serve_in_thread(chat) as url:
        res = runner.invoke(
            root,
            ["eval", "-d", "capitals", "--data-dir", str(data_dir), "--out", str(tmp_path / "j"), "--no-progress",
             "--judge-url", f"{url}/v1", "--judge-model", "judge-1", "agent.style=search-r1"],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    judge = json.loads((tmp_path / "j" / "summary.json").read_text())["datasets"]["capitals"]["judge"]
    assert (judge["judged"], judge["failures"]) == (4, 0)
    assert judge["accuracy"]["mean"] == pytest.approx(0.5)  # fr and fr2 list Paris among their golds
    assert len(asked) == 4 and {b["model"] for b in asked} == {"judge-1"}
