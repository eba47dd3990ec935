"""An agent run end to end on web tools: a scripted policy searches (Serper protocol), opens a result
(direct fetch behind the guard) and answers; a failing search server becomes a counted tool error; the
run's metrics.jsonl carries the cache hit rate and cost totals."""

from __future__ import annotations

import asyncio
import re

import pytest

from asearch.agent import AgentConfig, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.runs import RunDir
from asearch.tools import AccessTool, SearchTool
from asearch.web import (
    CacheConfig,
    SerperBackend,
    WebCache,
    WebConfig,
    WebPageBackend,
    WebRuntime,
    open_web,
)

QUESTION = "Where was Ada Varn born?"


def researcher(prompt: str) -> str:
    """Search, open the first result, answer from the page text it read."""
    if prompt.endswith("<summary>"):  # a reading turn: note what the block says
        block = prompt.rsplit("<information>", 1)[1]
        born = re.search(r"born in (\w+)", block)
        if "[page 1/" in block and born:
            return f"Ada was born in {born.group(1)}.</summary>"
        url = re.search(r"\[Doc 1\]\((\S+?)\):", block)
        return f"Doc 1 is at {url.group(1)} .</summary>" if url else "nothing useful</summary>"
    answer = re.findall(r"<summary>Ada was born in (\w+)\.", prompt)
    if answer:
        return f"<think>The page says so.</think>\n<answer>{answer[-1]}</answer>"
    url = re.findall(r"<summary>Doc 1 is at (\S+) \.", prompt)
    if url:
        return f"<think>Read the page.</think>\n<access>{url[-1]}</access>"
    if "search failed" in prompt:
        return "<answer>unknown</answer>"
    return "<think>Search first.</think>\n<search>Ada Varn born</search>"


def web_tools(fake_web, rt: WebRuntime, **serper_extra):
    serper_cfg = {"base_url": fake_web.base_url} | serper_extra
    return {
        "search": SearchTool(SerperBackend(serper_cfg, runtime=rt), {"topk": 3}),
        "access": AccessTool(
            WebPageBackend({"guard": {"allow_hosts": [f"127.0.0.1:{fake_web.port}"]}}, runtime=rt)
        ),
    }


def episode(tokenizer, tools, policy=researcher):
    engine = ScriptedEngine(tokenizer, policy)
    return asyncio.run(run_episode(engine, tokenizer, tools, QUESTION, AgentConfig(max_turns=12)))


def test_agent_searches_reads_and_answers_over_the_web(fake_web, tokenizer, tmp_path):
    rt = WebRuntime(WebCache(tmp_path / "web.sqlite"))
    traj = episode(tokenizer, web_tools(fake_web, rt))
    assert traj.finish == "answer" and traj.answer == "Oslen"
    assert [(t.kind, t.action) for t in traj.turns] == [
        ("act", "search"),
        ("read", None),
        ("act", "access"),
        ("read", None),
        ("act", "answer"),
    ]
    search_obs, access_obs = traj.turns[0].observation, traj.turns[2].observation
    assert search_obs.startswith(f'[Doc 1]({fake_web.url("ada-varn")}):\n"Ada Varn"\n')
    assert access_obs.startswith(f"[page 1/1 of {fake_web.url('ada-varn')}]\n")
    assert "Ada Varn was born in Oslen" in access_obs and "window.tracker" not in access_obs
    assert traj.counters.get("tool_errors", 0) == 0
    # what the model read is in its token context
    context = tokenizer.decode(traj.segments[0].token_ids)
    assert "Ada Varn was born in Oslen" in context
    assert fake_web.hits["serper"] == 1 and fake_web.hits["site"] == 1


def test_failing_search_server_is_an_observation_counted_as_tool_error(fake_web, tokenizer):
    fake_web.fail_next("serper", 10, status=503)
    rt = WebRuntime()
    tools = web_tools(fake_web, rt, resilience={"retries": 1, "backoff_s": 0.01, "max_backoff_s": 0.02})
    traj = episode(tokenizer, tools)
    assert traj.counters["tool_errors"] == 1 and traj.answer == "unknown"
    assert traj.turns[0].tool_error == (
        "search failed: serper: server error (HTTP 503): injected fault (HTTP 503) (2 attempts)"
    )
    assert "search failed: serper" in tokenizer.decode(traj.segments[0].token_ids)
    assert rt.stats()["serper"]["failures"] == 1 and fake_web.hits["serper"] == 2


def test_slow_search_server_times_out_into_an_observation(fake_web, tokenizer):
    fake_web.delay_s["serper"] = 1.0
    rt = WebRuntime()
    traj = episode(tokenizer, web_tools(fake_web, rt, resilience={"timeout_s": 0.2, "retries": 0}))
    assert traj.turns[0].tool_error == "search failed: serper: timeout after 0.2 s"
    assert traj.counters["tool_errors"] == 1


def test_run_metrics_show_cache_hit_rate_and_costs(fake_web, tokenizer, tmp_path):
    """Two training steps of the same episode: the second is served from the cache; metrics.jsonl has it."""
    cfg = WebConfig.model_validate(
        {
            "serper": {"base_url": fake_web.base_url},
            "fetch": {"guard": {"allow_hosts": [f"127.0.0.1:{fake_web.port}"]}},
            "cache": CacheConfig(path=str(tmp_path / "web.sqlite")).model_dump(),
            "cost": {"per_call_usd": {"serper": 0.001, "direct": 0.0}, "budget_usd": 1.0},
        }
    )
    web = open_web(cfg)
    tools = {"search": SearchTool(web.search, {"topk": 3}), "access": AccessTool(web.pages)}
    run = RunDir(tmp_path / "run", tensorboard=False)
    for step in (1, 2):
        traj = episode(tokenizer, tools)
        assert traj.answer == "Oslen"
        run.log(step, {"rollout/reward": 1.0, **web.metrics(end_step=True)})
    asyncio.run(web.aclose())

    rows = run.metrics()
    assert [r["step"] for r in rows] == [1, 2]
    first, second = rows
    assert (
        first["web/cache/hits"] == 0 and first["web/cache/misses"] == 2 and first["web/cache/hit_rate"] == 0.0
    )
    assert second["web/cache/hits"] == 2 and second["web/cache/hit_rate"] == 0.5
    assert first["web/cost/step_usd"] == pytest.approx(0.001) and second["web/cost/step_usd"] == 0.0
    assert first["web/cost/total_usd"] == second["web/cost/total_usd"] == pytest.approx(0.001)
    assert second["web/cost/budget_left_usd"] == pytest.approx(0.999)
    assert (
        second["web/serper/calls"] == 1
        and second["web/direct/calls"] == 1
        and second["web/serper/breaker_open"] == 0
    )
    assert fake_web.hits["serper"] == 1 and fake_web.hits["site"] == 1  # step 2 never went out
