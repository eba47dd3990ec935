"""The agent loop on real tools and a real tokenizer, driven by scripted policies (the engine seam)."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from asearch.agent import AgentConfig, Trajectory, run_episode
from asearch.engine.local.scripted import ScriptedEngine
from asearch.retrieval.index import open_index
from asearch.tools import AccessTool, SearchTool

DOCS = [
    ("Ada Varn", "Ada Varn is a chemist. Ada Varn was born in Oslen. She works for Brightwell."),
    ("Oslen", "Oslen is a city in Tarnia. Oslen has a harbour."),
    ("Brightwell", "Brightwell is a company founded in 1921. Its headquarters are in Kettering."),
    ("Tomas Grell", "Tomas Grell is a painter born in Kettering."),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory, build_mini_index, make_tokenizer):
    index = open_index(build_mini_index(tmp_path_factory.mktemp("idx") / "mini", "test-mini", DOCS))
    tools = {"search": SearchTool(index.retriever("bm25"), {"topk": 2}), "access": AccessTool(index.pages)}
    texts = [x for _, x in DOCS] * 20 + ["<search></search><answer></answer><summary></summary><think></think>"] * 20
    tok = make_tokenizer(texts, vocab_size=400)
    return tools, tok


def expert(prompt: str) -> str:
    """A scripted agent: search, read, answer from what it read."""
    if prompt.endswith("<summary>"):
        block = prompt.rsplit("<information>", 1)[1]
        m = re.search(r"born in (\w+)", block)
        return (f"Ada was born in {m.group(1)}." if m else "nothing useful") + "</summary>"
    m = re.findall(r"<summary>Ada was born in (\w+)\.", prompt)
    if m:
        return f"<think>I know it.</think>\n<answer>{m[-1]}</answer>"
    return "<think>Find Ada.</think>\n<search>Ada Varn born</search>"


def run(world, policy, **cfg):
    tools, tok = world
    engine = ScriptedEngine(tok, policy)
    return asyncio.run(run_episode(engine, tok, tools, "Where was Ada Varn born?", AgentConfig(**cfg))), tok


def test_search_read_answer_is_token_exact(world):
    traj, tok = run(world, expert, style_options={"compact_read_blocks": None})  # one segment: nothing cut
    assert traj.finish == "answer" and traj.answer == "Oslen"
    assert [(t.kind, t.action) for t in traj.turns] == [("act", "search"), ("read", None), ("act", "answer")]
    assert traj.counters["searches"] == 1 and traj.counters["read_turns"] == 1
    assert traj.counters.get("parse_errors", 0) == 0
    (seg,) = traj.segments
    assert len(seg.token_ids) == len(seg.loss_mask) == len(seg.logprobs) == len(seg.versions)
    # the model's own tokens, in order, are exactly the tokens of its outputs
    generated = [t for t, m in zip(seg.token_ids, seg.loss_mask, strict=True) if m]
    assert generated == [t for turn in traj.turns for t in tok.encode(turn.output_text, add_special_tokens=False)]
    assert all(v == -1 for v, m in zip(seg.versions, seg.loss_mask, strict=True) if not m)
    # the observation the model read is in its context, with the search result's url
    text = tok.decode(seg.token_ids)
    assert "[Doc 1](https://mini.example/wiki/Ada_Varn):" in text
    assert text.index("<information>") < text.index("<summary>Ada was born in Oslen.</summary>")


def test_malformed_turn_gets_correction_and_is_counted(world):
    state = {"n": 0}

    def sloppy(prompt):
        state["n"] += 1
        return "I am not sure." if state["n"] == 1 else expert(prompt)

    traj, tok = run(world, sloppy)
    assert traj.counters["parse_errors"] == 1
    assert traj.turns[0].parse_error.startswith("no action")
    assert "not understood" in tok.decode(traj.segments[0].token_ids)
    assert traj.answer == "Oslen"


@pytest.mark.parametrize("max_turns", [3, 130])
def test_turn_limit_is_exact_and_long_horizons_work(world, max_turns):
    traj, _ = run(world, lambda p: "<search>Oslen</search>", max_turns=max_turns, max_context_tokens=10**7)
    assert traj.finish == "max_turns"
    assert traj.num_turns == max_turns


def test_a_call_repeated_with_the_same_result_ends_the_episode(world):
    traj, _ = run(world, lambda p: "<search>Oslen</search>", max_turns=100, max_context_tokens=10**7, stop_repeats=3)
    assert traj.finish == "repeated" and traj.counters["searches"] == 3 and traj.answer is None

    def reread(prompt):  # reads past the end of a one-page document: the first call differs, then repeats
        return "read it</summary>" if prompt.endswith("<summary>") else "<access>https://mini.example/wiki/Oslen</access>"

    tools, tok = world
    paged = {**tools, "access": AccessTool(tools["access"].backend, {"chunk_chars": 30, "chunks_per_call": 1})}
    traj = asyncio.run(run_episode(ScriptedEngine(tok, reread), tok, paged, "Where is Oslen?",
                                   AgentConfig(max_turns=100, max_context_tokens=10**7, stop_repeats=3)))  # fmt: skip
    heads = [t.observation.split("]")[0] for t in traj.turns if t.kind == "act"]
    assert traj.finish == "repeated" and heads == [
        "[page 1/2 of https://mini.example/wiki/Oslen", "[page 2/2 of https://mini.example/wiki/Oslen"
    ] + ["[https://mini.example/wiki/Oslen has no page 3: all 2 pages were shown"] * 3

    queries = iter(["<search>Oslen</search>", "<search>Tarnia</search>"] * 50)
    alternate = lambda p: "read it</summary>" if p.endswith("<summary>") else next(queries)  # noqa: E731
    traj, _ = run(world, alternate, max_turns=20, max_context_tokens=10**7, stop_repeats=2)
    assert traj.finish == "max_turns"  # a different call in between breaks the run


def test_context_budget_stops_the_episode(world):
    traj, _ = run(world, lambda p: "<search>Oslen harbour</search>", max_context_tokens=700, max_turns=100)
    assert traj.finish == "max_tokens"
    assert all(t.prompt_tokens + t.output_tokens <= 700 for t in traj.turns)


def test_access_and_unknown_url_are_observations(world):
    def policy(prompt):
        if prompt.endswith("<summary>"):
            return "read it</summary>"
        if "nowhere.example" not in prompt:
            return "<access>https://nowhere.example/x</access>"
        if "[page 1/1 of https://mini.example/wiki/Oslen]" not in prompt:
            return "<access>https://mini.example/wiki/Oslen</access>"
        return "<answer>Tarnia</answer>"

    traj, _ = run(world, policy)
    assert traj.answer == "Tarnia" and traj.counters["accesses"] == 2
    assert traj.counters.get("tool_errors", 0) == 0  # an unknown url is information, not a tool failure


def test_failing_tool_is_counted_not_raised(world):
    tools, tok = world

    class Broken:
        name = "broken"

        def search(self, queries, topk):
            raise RuntimeError("index on fire")

    bad = {"search": SearchTool(Broken())}
    engine = ScriptedEngine(tok, lambda p: "<answer>x</answer>" if "failed" in p else "<search>q</search>")
    traj = asyncio.run(run_episode(engine, tok, bad, "q?", AgentConfig(style="search-r1")))
    assert traj.counters["tool_errors"] == 1 and traj.turns[0].tool_error
    assert traj.answer == "x"


def test_search_r1_refuses_access(world):
    traj, _ = run(
        world,
        lambda p: "<answer>a</answer>" if "not available" in p else "<access>https://mini.example/wiki/Oslen</access>",
        style="search-r1",
    )
    assert traj.counters["parse_errors"] == 1 and traj.answer == "a"


def test_reasoning_style_rebuilds_prompt_and_forces_answer(world):
    prompts = []

    def policy(prompt):
        prompts.append(prompt)
        if prompt.endswith("<summary>"):
            return "x" * 50 + "</summary>"
        if "final answer now" in prompt:
            return "<answer>done</answer>"
        return f"<search>query {len(prompts)}</search>"

    traj, _ = run(world, policy, style="reasoning", style_options={"force_answer_after": 3, "history_chars": 200})
    assert traj.answer == "done" and traj.counters["searches"] == 3
    assert len(traj.segments) == traj.num_turns  # one segment per call
    assert all(len(p) < 2500 for p in prompts)  # notes truncated to the last 200 characters
    assert "<search>query 1</search>" not in prompts[-1]


def test_compaction_starts_a_new_segment_with_short_block(world):
    traj, tok = run(world, expert, style_options={"compact_read_blocks": 30})
    assert traj.answer == "Oslen" and len(traj.segments) == 2
    last = tok.decode(traj.segments[1].token_ids)
    assert "Ada was born in Oslen" in last and "Brightwell" not in last
    assert sum(traj.segments[1].loss_mask) == traj.turns[-1].output_tokens


def test_trajectory_round_trips_through_json(world):
    traj, _ = run(world, expert)
    back = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert back == traj


def test_on_turn_sees_every_turn_once_in_order(world):
    tools, tok = world
    seen = []
    traj = asyncio.run(
        run_episode(ScriptedEngine(tok, expert), tok, tools, "Where was Ada Varn born?", AgentConfig(), on_turn=seen.append)
    )
    assert seen == traj.turns and seen[0].observation and "[Doc 1]" in seen[0].observation


def test_chat_models_get_tool_results_in_user_turns(world):
    tools, tok = world
    assert tok.chat_template  # ChatML, like SmolLM2 / Qwen

    def policy(prompt):  # ends its turns with the end-of-turn token, as chat models do
        return expert(prompt) + "<|im_end|>" if not prompt.endswith("<summary>") else expert(prompt)

    traj = asyncio.run(run_episode(ScriptedEngine(tok, policy), tok, tools, "Where was Ada Varn born?", AgentConfig()))
    assert traj.answer == "Oslen"
    text = tok.decode(traj.segments[0].token_ids)
    assert "</search><|im_end|>\n<|im_start|>user\n<information>" in text  # not a doubled <|im_end|>
    assert "</information><|im_end|>\n<|im_start|>assistant\n<summary>" in text
    assert "<|im_end|><|im_end|>" not in text


def test_act_prefixes_open_turns_and_count_as_context(world):
    tools, tok = world
    seen = []

    def policy(prompt):
        seen.append(prompt[-10:])
        return "Oslen</answer>" if prompt.endswith("<answer>") else "Ada Varn</search>"

    cfg = AgentConfig(style="guided")
    traj = asyncio.run(run_episode(ScriptedEngine(tok, policy), tok, tools, "Where was Ada Varn born?", cfg))
    assert traj.answer == "Oslen" and traj.counters["searches"] == 1
    assert seen[0].endswith("<search>") and seen[1].endswith("<answer>")
    assert traj.turns[0].output_text == "<search>Ada Varn</search>"
    # the prefix is context (mask 0): generated tokens are only the model's own text
    gen = [t for t, m in zip(traj.segments[0].token_ids, traj.segments[0].loss_mask, strict=True) if m]
    assert tok.decode(gen) == "Ada Varn</search>Oslen</answer>"


def test_guided_style_closes_an_opened_answer_and_counts_it(world):
    tools, tok = world

    def policy(prompt):  # a small chat model: ends its turn instead of writing the closing tag
        return "Oslen, a city<|im_end|>" if prompt.endswith("<answer>") else "Ada Varn</search>"

    traj = asyncio.run(
        run_episode(ScriptedEngine(tok, policy), tok, tools, "Where was Ada Varn born?", AgentConfig(style="guided"))
    )
    assert traj.answer == "Oslen, a city" and traj.counters["auto_closed"] == 1
    assert traj.turns[-1].output_text == "<answer>Oslen, a city</answer>"


def test_turn_seeds_fit_a_servers_signed_int64_and_differ_per_turn() -> None:
    """vLLM refuses a seed above 2**63 - 1 (HTTP 422): a 63-bit episode seed times the turn stride must fold."""
    from asearch.agent.loop import turn_seed

    big = 2**63 - 1
    seeds = [turn_seed(big, t) for t in range(200)]
    assert all(0 <= s < 2**63 for s in seeds) and len(set(seeds)) == 200
    assert turn_seed(7, 3) == 7 * 1_000_003 + 3  # small seeds are unchanged
