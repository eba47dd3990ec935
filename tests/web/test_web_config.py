"""Web tools chosen through the one config system (`tools.web...`), end to end: `asearch eval` over the fake
Serper server and static site reports cache hits/misses and costs in summary.json, a cache-only replay
answers the same with no paid call (and no API key), and `train` logs the web counters every step."""

from __future__ import annotations

import asyncio
import json
import re

import pytest
import typer
from typer.testing import CliRunner

from asearch.agent.runtime import RuntimeConfig
from asearch.config import load_config
from asearch.engine.local.scripted import ScriptedEngine
from asearch.errors import ConfigError
from asearch.tools import build_tools
from asearch.web.runtime import web_metrics

QUESTIONS = {  # question -> (the search the policy makes, gold answer)
    "Where was Ada Varn born?": ("Ada Varn born", "Oslen"),
    "When was Brightwell founded?": ("Brightwell founded", "1921"),
}


def researcher(prompt: str) -> str:
    """Search the question, open Doc 1, answer with the fact the page states."""
    if prompt.endswith("<summary>"):  # a reading turn: note what the block says
        block = prompt.rsplit("<information>", 1)[1]
        fact = re.search(r"(?:born|founded) in (\w+)", block)
        if "[page 1/" in block and fact:
            return f"Found: {fact.group(1)}.</summary>"
        url = re.search(r"\[Doc 1\]\((\S+?)\):", block)
        return f"Doc 1 is at {url.group(1)} .</summary>" if url else "nothing useful</summary>"
    if found := re.findall(r"<summary>Found: (\w+)\.", prompt):
        return f"<answer>{found[-1]}</answer>"
    if url := re.findall(r"<summary>Doc 1 is at (\S+) \.", prompt):
        return f"<access>{url[-1]}</access>"
    query = next(q for question, (q, _) in QUESTIONS.items() if question in prompt)
    return f"<search>{query}</search>"


def web_overrides(fake_web, tmp_path, *extra: str) -> list[str]:
    return [
        "tools.web.search=serper",
        "tools.web.reader=direct",
        f"tools.web.serper.base_url={fake_web.base_url}",
        f'tools.web.fetch.guard.allow_hosts=["127.0.0.1:{fake_web.port}"]',  # loopback: this test only
        f"tools.web.cache.path={tmp_path / 'web.sqlite'}",
        "tools.web.cost.budget_usd=1.0",
        "tools.search.topk=3",
        *extra,
    ]


def test_web_tools_are_a_tools_source_in_the_runtime_config(fake_web, tmp_path):
    cfg = load_config(RuntimeConfig, None, web_overrides(fake_web, tmp_path, "tools.access=null"))
    assert cfg.tools.web is not None and cfg.tools.web.cache.mode == "read_write"
    assert RuntimeConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # as eval and dump_config do
    tools, closers = build_tools(cfg.tools, progress=False)
    assert sorted(tools) == ["search"]  # tools.access=null holds for the web too
    assert tools["search"].config.topk == 3  # tools.search applies to web search
    assert web_metrics(tools)["web/cache/hits"] == 0.0 and web_metrics({}) == {}
    for close in closers:
        asyncio.run(close())

    with pytest.raises(ConfigError, match="give only one of"):
        load_config(RuntimeConfig, None, ["tools.web.search=serper", "tools.server_url=http://127.0.0.1:1"])
    with pytest.raises(ConfigError, match="unknown key 'tools.web.search_tool'"):
        load_config(RuntimeConfig, None, ["tools.web.search_tool.topk=3"])  # tool options live in tools.search
    with pytest.raises(ConfigError, match="unknown key 'tools.web.serper.api_key'"):
        load_config(RuntimeConfig, None, ["tools.web.serper.api_key=sk-x"])  # keys only from the environment


def test_eval_over_the_web_reports_cache_and_cost_and_replays_cache_only(
    fake_web, tokenizer, tmp_path, monkeypatch
):
    import asearch.agent.runtime as rt
    from asearch.cli.eval import app

    # only the policy is a stand-in: the tools come from the config, through build_runtime -> build_tools
    monkeypatch.setattr(rt, "build_engine", lambda cfg: (ScriptedEngine(tokenizer, researcher), tokenizer))
    data = tmp_path / "data" / "webqa"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text(
        "".join(
            json.dumps({"id": f"q{i}", "question": q, "golden_answers": [gold]}) + "\n"
            for i, (q, (_, gold)) in enumerate(QUESTIONS.items())
        )
    )
    root = typer.Typer()
    root.add_typer(app, name="eval")

    def run_eval(out: str, *extra: str) -> dict:
        args = [
            "eval",
            "-d",
            "webqa",
            "--data-dir",
            str(tmp_path / "data"),
            "--out",
            str(tmp_path / out),
            "--no-progress",
            "agent.max_turns=12",
            "agent.style=asearcher",  # the scripted policy's protocol (the default model would get `guided`)
            *web_overrides(fake_web, tmp_path, *extra),
        ]
        res = CliRunner().invoke(root, args)
        assert res.exit_code == 0, res.output
        assert "Web tools (this invocation): cache hit rate" in res.output
        return json.loads((tmp_path / out / "summary.json").read_text())

    def answers(out: str) -> dict:
        lines = (tmp_path / out / "results.jsonl").read_text().splitlines()
        return {r["id"]: r["prediction"] for r in map(json.loads, lines)}

    first = run_eval("live")
    assert first["overall"]["metrics"]["em"]["avg_at_k"]["mean"] == 1.0
    m = first["run_metrics"]
    assert m["web/cache/hits"] == 0 and m["web/cache/misses"] == 4 and m["web/cache/writes"] == 4
    assert m["web/cost/serper_calls"] == 2 and m["web/cost/direct_calls"] == 2
    assert m["web/cost/total_usd"] == pytest.approx(0.002)  # the default Serper price, 0.001 per call
    assert m["web/cost/budget_left_usd"] == pytest.approx(0.998)
    assert fake_web.hits["serper"] == 2 and fake_web.hits["site"] == 2

    monkeypatch.delenv("SERPER_API_KEY")  # a replay needs no key
    replay = run_eval("replay", "tools.web.cache.mode=cache_only")
    assert answers("replay") == answers("live") == {"q0": "Oslen", "q1": "1921"}
    m = replay["run_metrics"]
    assert m["web/cache/hits"] == 4 and m["web/cache/misses"] == 0 and m["web/cache/hit_rate"] == 1.0
    assert m["web/cost/total_usd"] == 0.0 and not [k for k in m if k.endswith("_calls")]
    assert fake_web.hits["serper"] == 2 and fake_web.hits["site"] == 2  # nothing went out


def test_train_logs_web_counters_every_step(fake_web, tokenizer, make_tiny_model, tmp_path):
    """A one-step RL run of a random tiny model on web tools: metrics.jsonl carries the web/ counters."""
    from asearch.launch.train import TrainConfig, train
    from asearch.runs import RunDir

    data = tmp_path / "train.jsonl"
    data.write_text(
        json.dumps({"id": "q0", "question": "Where was Ada Varn born?", "golden_answers": ["Oslen"]})
    )
    cfg = load_config(
        TrainConfig,
        None,
        [
            *web_overrides(fake_web, tmp_path),
            "model=tiny",
            f"data={data}",
            "steps=1",
            "agent.max_turns=1",
            "agent.max_new_tokens=4",
            "rollout.batch_size=1",
            "rollout.group_size=2",
            "rollout.drop_zero_variance=false",
        ],
    )
    model = make_tiny_model(tokenizer, max_positions=512)
    run = RunDir(tmp_path / "run", tensorboard=False)
    asyncio.run(train(cfg, run=run, log=lambda _: None, model=model, tokenizer=tokenizer))
    (row,) = run.metrics()
    assert {"web/cache/hit_rate", "web/cost/total_usd", "web/cost/step_usd", "web/serper/calls"} <= set(row)
