"""The training session of an OpenAI-client agent: every trained token is the token the engine sampled.

An agent written only against `openai.AsyncOpenAI` runs in `OpenAIAgentWorkflow` over the in-process engine
(a random tiny model: real sampling, real log-probs). Every completion the engine produced is found in the
trajectory's segments call by call, with its log-probs and versions, under loss mask 1, and nothing else is.
A chat template that re-renders history (drops earlier `<think>` blocks, as Qwen3's does) makes later prompts
differ from what was sampled: each such call is counted and trained as its own segment.
"""

from __future__ import annotations

import asyncio
import copy
import json
from copy import deepcopy

import pytest

pytest.importorskip("openai")
torch = pytest.importorskip("torch")

from asearch.agent.loop import AgentConfig  # noqa: E402
from asearch.agent.openai_session import call_tool  # noqa: E402
from asearch.agent.openai_workflow import OpenAIAgentWorkflow, WorkflowConfig, load_agent  # noqa: E402
from asearch.engine.chat_tools import CHATML_TOOLS_TEMPLATE, render_call_text  # noqa: E402
from asearch.engine.local.scripted import ScriptedEngine  # noqa: E402
from asearch.engine.types import GenerateResponse  # noqa: E402
from asearch.errors import ConfigError  # noqa: E402
from asearch.rl.trainer import groups_to_samples  # noqa: E402
from asearch.tools.base import Observation  # noqa: E402

ITEM = {"id": "q1", "question": "who built the bridge?", "golds": ["Ada"]}
TOOLS = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}]
# Qwen3's habit: an earlier assistant turn is re-rendered without its <think> block
DROPS_THINKING = CHATML_TOOLS_TEMPLATE.replace(
    "{{ message['content'] or '' }}",
    "{{ (message['content'] or '').split('</think>')[-1] if not loop.last else (message['content'] or '') }}",
)


@pytest.fixture(scope="module")
def tokenizer(make_tokenizer):
    texts = ["who built the bridge? Ada built it. <think>plan</think> search the bridge", json.dumps(TOOLS)]
    tok = copy.deepcopy(make_tokenizer(texts * 8, vocab_size=320))  # a copy: its chat template changes
    tok.chat_template = CHATML_TOOLS_TEMPLATE
    return tok


class Recording:
    """An engine wrapper keeping every (prompt ids, response) it produced, in order."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    @property
    def version(self) -> int:
        return self.engine.version

    async def generate(self, request) -> GenerateResponse:
        resp = await self.engine.generate(request)
        self.calls.append((list(request.input_ids), resp))
        return resp


async def chatty_agent(client, item) -> str:
    """Three turns of chat, each reply appended to the history as the client returned it."""
    messages = [{"role": "system", "content": "answer"}, {"role": "user", "content": item.question}]
    for _ in range(3):
        r = await client.chat.completions.create(model="any-name", messages=messages, max_tokens=32, temperature=0.0)
        messages += [r.choices[0].message, {"role": "user", "content": "go on"}]
    return r.choices[0].message.content or ""


def agent_cfg(**kw) -> AgentConfig:
    return AgentConfig(**{"temperature": 1.0, "max_new_tokens": 64, "max_context_tokens": 512, **kw})


def check_token_exact(traj, calls) -> None:
    """Each engine call's prompt and sampled tokens, in the segment its turn names; loss mask 1 on exactly the
    sampled tokens, with the engine's log-probs and versions."""
    assert len(traj.turns) == len(calls)
    covered = {k: [0] * len(s) for k, s in enumerate(traj.segments)}
    for turn, (prompt, resp) in zip(traj.turns, calls, strict=True):
        seg = traj.segments[turn.segment]
        n, out = len(prompt), resp.output_ids
        assert seg.token_ids[:n] == prompt and seg.token_ids[n : n + len(out)] == out
        assert seg.logprobs[n : n + len(out)] == resp.output_logprobs and seg.versions[n : n + len(out)] == resp.output_versions
        assert seg.loss_mask[n : n + len(out)] == [1] * len(out)
        covered[turn.segment][n : n + len(out)] = [1] * len(out)
    assert all(covered[k] == s.loss_mask for k, s in enumerate(traj.segments))  # nothing else is trained


def test_every_trained_token_is_the_sampled_token_call_by_call(tokenizer, make_tiny_model) -> None:
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig

    model = make_tiny_model(tokenizer, kv_heads=1, intermediate=64, seed=1)
    engine = Recording(InProcessEngine(model, tokenizer, cfg=InProcessEngineConfig(max_seq_len=512), version=3))
    flow = OpenAIAgentWorkflow(chatty_agent, tokenizer, agent_cfg(max_new_tokens=6))

    async def run():
        try:
            return await flow.arun_episode(engine, ITEM, seed=11)
        finally:
            await engine.engine.close()

    traj = asyncio.run(run())
    assert traj is not None and traj.counters["llm_calls"] == 3 and len(engine.calls) == 3
    check_token_exact(traj, engine.calls)
    sampled = [lp for _, r in engine.calls for lp in r.output_logprobs]
    assert any(lp < 0 for lp in sampled)  # sampled at the workflow's temperature 1, not the agent's 0
    assert {v for _, r in engine.calls for v in r.output_versions} == {3}
    # the trainer's samples are the segments as recorded
    samples, _ = groups_to_samples([[1.0]], [[traj]], flow_cfg_advantages())
    assert [s.token_ids for s in samples] == [s.token_ids for s in traj.segments if s.n_generated]
    assert traj.counters.get("prompt_mismatches", 0) == len(traj.segments) - 1


def flow_cfg_advantages():
    from asearch.rl.advantages import AdvantageConfig

    return AdvantageConfig()


def test_a_template_that_rerenders_history_is_counted_and_split(tokenizer) -> None:
    replies = ["<think>plan</think>Ada", "<think>plan</think>built it", "<think>plan</think>Ada"]
    for template, mismatches in ((CHATML_TOOLS_TEMPLATE, 0), (DROPS_THINKING, 2)):
        tok = deepcopy(tokenizer)
        tok.chat_template = template
        engine = Recording(ScriptedEngine.from_replies(tok, replies))
        traj = asyncio.run(OpenAIAgentWorkflow(chatty_agent, tok, agent_cfg()).arun_episode(engine, ITEM))
        assert traj.counters.get("prompt_mismatches", 0) == mismatches
        assert len(traj.segments) == mismatches + 1
        check_token_exact(traj, engine.calls)
        assert traj.finish == "answer" and traj.answer == tok.decode(engine.calls[-1][1].output_ids)


async def search_agent(client, item) -> str:
    """Function calling with asearch's search tool: call it while the model asks, then answer."""
    messages = [{"role": "user", "content": item.question}]
    for _ in range(4):
        r = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = r.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return message.content
        for call in message.tool_calls:
            result = await call_tool(call.function.name, json.loads(call.function.arguments)["query"])
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    return ""


class FakeSearch:
    name, counter, description = "search", "searches", "search"

    def __init__(self, fault: bool = False):
        self.fault, self.queries = fault, []

    def parse(self, raw: str) -> str:
        return raw

    async def call(self, query: str, episode) -> Observation:
        self.queries.append(query)
        if self.fault:
            return Observation("search failed: timeout", {"fault": "infrastructure", "error": "timeout"}, "timeout")
        return Observation("Ada built the bridge.")


def test_a_function_calling_agent_is_scored_counted_and_masked(tokenizer) -> None:
    call = render_call_text([{"name": "search", "arguments": {"query": "bridge"}}], "hermes")
    for fault in (False, True):
        search = FakeSearch(fault)
        engine = Recording(ScriptedEngine.from_replies(tokenizer, [call, "Ada"]))
        flow = OpenAIAgentWorkflow(search_agent, tokenizer, agent_cfg(), tools={"search": search})
        traj = asyncio.run(flow.arun_episode(engine, ITEM))
        assert search.queries == ["bridge"] and traj.answer == "Ada" and traj.reward == 1.0 and traj.score == 1.0
        assert traj.counters["searches"] == 1 and traj.counters["tool_calls"] == 1 and traj.counters["llm_calls"] == 2
        assert traj.turns[0].action == "search" and traj.turns[0].observation is not None
        assert traj.met_infra_fault is fault  # masked out of the loss and accuracy like the built-in agent's
        check_token_exact(traj, engine.calls)
        assert "<tool_call>" in tokenizer.decode(traj.segments[0].token_ids[: len(engine.calls[1][0])])


def test_malformed_calls_fail_the_format_gate_and_failures_end_episodes(tokenizer) -> None:
    bad = '<tool_call>{"name": "search", "arguments": </tool_call>'
    traj = asyncio.run(OpenAIAgentWorkflow(search_agent, tokenizer, agent_cfg(), tools={"search": FakeSearch()})
                       .arun_episode(ScriptedEngine.from_replies(tokenizer, [bad]), ITEM))  # fmt: skip
    assert traj.counters["tool_call_parse_errors"] == traj.counters["parse_errors"] == 1 and traj.reward == 0.0 and traj.reward_reason.startswith("format")
    # a call beyond agent.max_turns is refused: the episode ends there
    looping = render_call_text([{"name": "search", "arguments": {"query": "x"}}], "hermes")
    flow = OpenAIAgentWorkflow(search_agent, tokenizer, agent_cfg(max_turns=2), tools={"search": FakeSearch()})
    traj = asyncio.run(flow.arun_episode(ScriptedEngine.from_replies(tokenizer, [looping]), ITEM))
    assert traj.finish == "max_turns" and traj.num_turns == 2 and traj.reward == 0.0

    async def broken(client, item):
        raise KeyError("oops")

    async def own_reward(client, item):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        return 0.25

    traj = asyncio.run(OpenAIAgentWorkflow(broken, tokenizer, agent_cfg()).arun_episode(ScriptedEngine.from_replies(tokenizer, ["x"]), ITEM))
    assert traj.finish == "error" and traj.counters["agent_errors"] == 1 and "KeyError" in traj.metadata["agent_error"]
    traj = asyncio.run(OpenAIAgentWorkflow(own_reward, tokenizer, agent_cfg()).arun_episode(ScriptedEngine.from_replies(tokenizer, ["x"]), ITEM))
    assert traj.reward == 0.25 and traj.segments[0].n_generated > 0


def test_an_aborted_completion_rejects_the_episode(tokenizer) -> None:
    class Aborting(ScriptedEngine):
        async def generate(self, request):
            resp = await super().generate(request)
            resp.stop_reason = "abort"
            return resp

    flow = OpenAIAgentWorkflow(chatty_agent, tokenizer, agent_cfg())
    assert asyncio.run(flow.arun_episode(Aborting(tokenizer, lambda p: "x"), ITEM)) is None
    assert flow.rejected == {"abort": 1}


def test_workflow_config_names_an_agent(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs workflow.agent"):
        WorkflowConfig(kind="openai_agent")
    path = tmp_path / "my_agent.py"
    path.write_text("async def agent(client, item):\n    return 'x'\n\ndef not_async(client, item):\n    return 1\n")
    assert load_agent(f"{path}:agent").__name__ == "agent"
    with pytest.raises(ConfigError, match="no async function"):
        load_agent(f"{path}:not_async")
    with pytest.raises(ConfigError, match="cannot import"):
        load_agent("no_such_module_x:agent")


def test_loopback_sessions_serve_any_http_client(tokenizer) -> None:
    import httpx

    seen = []

    async def raw_http_agent(client, item) -> str:
        """An agent with its own HTTP stack: it only reads the session's URL off the client."""
        seen.append(str(client.base_url))
        async with httpx.AsyncClient(timeout=30) as http:
            r = await http.post(f"{client.base_url}chat/completions", json={"model": "x", "messages": [{"role": "user", "content": item.question}]})
        return r.json()["choices"][0]["message"]["content"]

    flow = OpenAIAgentWorkflow(raw_http_agent, tokenizer, agent_cfg(), sessions="loopback")
    engine = Recording(ScriptedEngine.from_replies(tokenizer, ["Ada"]))

    async def run():
        try:
            return [await flow.arun_episode(engine, ITEM) for _ in range(2)]
        finally:
            await flow.router.stop_loopback()

    trajs = asyncio.run(run())
    assert all(url.startswith("http://127.0.0.1:") for url in seen) and seen[0].split("/sessions/")[0] == seen[1].split("/sessions/")[0]
    assert [t.answer for t in trajs] == ["Ada", "Ada"] and [t.reward for t in trajs] == [1.0, 1.0]
    for traj, call in zip(trajs, engine.calls, strict=True):
        check_token_exact(traj, [call])


def test_a_turn_discount_trains_each_completion_apart_with_its_share(tokenizer) -> None:
    engine = Recording(ScriptedEngine.from_replies(tokenizer, ["Ada", "built", "it"]))
    traj = asyncio.run(OpenAIAgentWorkflow(chatty_agent, tokenizer, agent_cfg(), turn_discount=0.5).arun_episode(engine, ITEM))
    assert [s.advantage_scale for s in traj.segments] == [0.25, 0.5, 1.0] and traj.counters.get("prompt_mismatches", 0) == 0
    check_token_exact(traj, engine.calls)
    for seg, (prompt, resp) in zip(traj.segments, engine.calls, strict=True):
        assert seg.token_ids == prompt + resp.output_ids  # each completion with its own prompt
    samples, adv = groups_to_samples([[1.0, 0.0]], [[traj, traj]], flow_cfg_advantages())
    assert [s.advantage for s in samples[:3]] == pytest.approx([float(adv[0, 0]) * f for f in (0.25, 0.5, 1.0)])
