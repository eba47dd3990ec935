"""The long-horizon agent (issue 16): long pages read chunk by chunk with summaries, compaction inside an
episode, and the trainer seeing exactly the tokens the model saw at every turn."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

import pytest

from asearch.agent import AgentConfig, run_episode
from asearch.agent.expert import NOT_FOUND, reading_plan_from_record, summary_found
from asearch.corpus.types import Page
from asearch.corpus.world import WorldCorpus
from asearch.demo.presets import PRESETS
from asearch.demo.worlds import ExpertMistakes, expert_engine, world_records
from asearch.engine.local.scripted import ScriptedEngine
from asearch.engine.types import GenerateRequest, GenerateResponse
from asearch.metrics.qa import exact_match
from asearch.rl.sft import trajectories_to_samples
from asearch.tools import AccessTool, SearchTool, ToolsConfig, build_tools, ensure_index, render

LONG = PRESETS["long"]
HOPS = tuple(LONG["hops"])


@pytest.fixture(scope="module")
def long_world(make_tokenizer):
    """A world of the long preset, its questions of 1-6 hops, the preset's tools over it, a tokenizer."""
    world = WorldCorpus(5, 1000, names=255, pages="long")
    records = world_records(5, 1000, 60, HOPS, "t", names=255, pages="long", name_answers=True)
    tools_cfg = ToolsConfig.model_validate({**LONG["rl"]["tools"], "corpus": world.name})
    ensure_index(tools_cfg.corpus or "", tools_cfg.build, progress=False)
    tools, closers = build_tools(tools_cfg, progress=False)
    pages = [p.contents for p in world.pages()]
    tok = make_tokenizer(pages[:400] + [r.question for r in records] + ["<search> </search><access> </access><answer> </answer><summary> </summary>"] * 50 + [d.url for d in world.documents()], vocab_size=1500)
    yield world, records, tools, tok
    for close in closers:
        close()


def preset_agent(**changes) -> AgentConfig:
    return AgentConfig.model_validate({**LONG["rl"]["agent"], **changes})


class RecordingEngine:
    """The expert engine, remembering every request's prompt ids and the ids it answered with."""

    def __init__(self, inner: ScriptedEngine):
        self.inner, self.calls = inner, {}

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        resp = await self.inner.generate(request)
        self.calls.setdefault(request.trajectory_id, []).append((list(request.input_ids or []), list(resp.output_ids)))
        return resp


def run_expert(long_world, mistakes: ExpertMistakes, agent: AgentConfig, engine_wrapper=lambda e: e):
    world, records, tools, tok = long_world
    engine = engine_wrapper(expert_engine(tok, records, mistakes, seed=1))

    async def go():
        return await asyncio.gather(*(run_episode(engine, tok, tools, r.question, agent, trajectory_id=r.id) for r in records))

    return records, asyncio.run(go()), engine


PERFECT = ExpertMistakes(p_skip=0.0, reading=True, p_stop=0.0, p_distract=0.0)


def test_search_never_shows_an_asked_fact_and_pages_run_several_chunks(long_world):
    world, records, _, _ = long_world
    snippets = {d.url: d.text for d in world.documents()}
    chunk_chars = LONG["rl"]["tools"]["access"]["chunk_chars"]
    where = Counter()
    for r in records:
        for ev in r.metadata["evidence"]:
            assert all(ev["statement"] not in text for text in snippets.values())  # no search result states it
            assert ev["value"] not in snippets[ev["url"]]
            chunks = render.chunk_page(world.page(ev["url"]).contents, ev["url"], chunk_chars=chunk_chars, max_chunks=10, at_lines=True).chunks
            assert len(chunks) >= 3
            (k,) = [k for k, c in enumerate(chunks) if ev["statement"] in c.splitlines()]  # on one whole line
            where[k] += 1
    assert len(where) >= 3  # the fact sits anywhere in the page, not always in the same chunk
    assert Counter(r.metadata["hops"] for r in records) == {h: 10 for h in HOPS}


def test_the_expert_reads_every_hop_and_answers(long_world):
    records, trajs, _ = run_expert(long_world, PERFECT, preset_agent(max_context_tokens=100_000))
    assert all(t.finish == "answer" and exact_match(t.answer, r.golds[0]) for r, t in zip(records, trajs, strict=True))
    for r, t in zip(records, trajs, strict=True):
        hops = r.metadata["hops"]
        assert t.counters["searches"] == hops and t.counters["accesses"] >= hops
        assert t.counters["read_turns"] == t.counters["accesses"]  # one reading turn per chunk opened
        assert {turn.kind for turn in t.turns} == {"act", "read"}
    six = [t.num_turns for r, t in zip(records, trajs, strict=True) if r.metadata["hops"] == 6]
    assert min(six) >= 24 and max(six) >= 30  # long horizons


def test_the_experts_mistakes_lower_accuracy_but_leave_every_behaviour(long_world):
    sloppy = ExpertMistakes(p_skip=0.2, reading=True, p_stop=0.2, p_distract=0.2)
    records, trajs, _ = run_expert(long_world, sloppy, preset_agent(max_context_tokens=100_000))
    correct = [exact_match(t.answer or "", r.golds[0]) for r, t in zip(records, trajs, strict=True)]
    assert 0.1 < sum(correct) / len(correct) < 0.8
    assert any(c and r.metadata["hops"] >= 4 for c, r in zip(correct, records, strict=True))


def test_a_summary_names_the_key_first_found_or_not(long_world):
    records, trajs, _ = run_expert(long_world, PERFECT, preset_agent(max_context_tokens=100_000))
    summaries = [t.output_text.removesuffix("</summary>").strip() for traj in trajs for t in traj.turns if t.kind == "read"]
    found = [s for s in summaries if summary_found(s)]
    assert 0 < len(found) < len(summaries)
    keys = {k for r in records for k in reading_plan_from_record(r.model_dump()).keys}
    assert all(s.endswith(f" {NOT_FOUND}") and s.removesuffix(f" {NOT_FOUND}") in keys for s in summaries if s not in found)
    assert sum(map(len, (reading_plan_from_record(r.model_dump()).keys for r in records))) == len(found)  # one per hop
    assert not summary_found("employer none") and not summary_found("") and summary_found("employer Rurvin Partners")


def test_skimming_episodes_never_read_past_a_first_chunk_and_the_rest_read_to_the_line(long_world):
    records, trajs, engine = run_expert(long_world, ExpertMistakes(p_skip=0.0, reading=True, p_stop=0.0, p_distract=0.0, p_skim=0.6), preset_agent(max_context_tokens=100_000))
    expert = engine.policy
    skims = [expert.skims(r.question) for r in records]
    assert 0.4 < sum(skims) / len(skims) < 0.8
    for r, t, skim in zip(records, trajs, skims, strict=True):
        right = exact_match(t.answer or "", r.golds[0])
        if skim:  # one chunk per page opened: as many accesses as searches
            assert t.counters["accesses"] == t.counters["searches"]
        else:
            assert right
    reads_on = [t.counters["accesses"] > t.counters["searches"] for t, skim in zip(trajs, skims, strict=True) if not skim]
    assert any(reads_on)  # the patient episodes open later chunks
    assert not all(exact_match(t.answer or "", r.golds[0]) for r, t in zip(records, trajs, strict=True))


def test_every_turn_the_trainer_sees_is_the_prompt_the_model_saw(long_world):
    """Rebuild each turn's prompt from the trajectory and compare ids with what the engine received,
    with compaction happening inside the episode (the preset's context budget)."""
    records, trajs, engine = run_expert(long_world, PERFECT, preset_agent(), RecordingEngine)
    assert sum(t.counters.get("compactions", 0) for t in trajs) > 0
    compacted = [t for t in trajs if t.counters.get("compactions", 0)]
    assert all(len(t.segments) == 1 + t.counters["compactions"] for t in compacted)
    for traj in trajs:
        calls = engine.calls[traj.id]
        assert len(calls) == traj.num_turns
        for turn, (prompt_ids, output_ids) in zip(traj.turns, calls, strict=True):
            seg = traj.segments[turn.segment]
            assert seg.token_ids[: turn.prompt_tokens] == prompt_ids
            out = seg.token_ids[turn.prompt_tokens : turn.prompt_tokens + turn.output_tokens]
            assert out == output_ids and all(seg.loss_mask[turn.prompt_tokens : turn.prompt_tokens + turn.output_tokens])
        # what training gets: each segment's loss-masked tokens are exactly the outputs generated in it
        samples = trajectories_to_samples([traj])
        per_segment = [[t for turn, (_, out) in zip(traj.turns, calls, strict=True) if turn.segment == s for t in out] for s in range(len(traj.segments))]
        assert [[t for t, m in zip(s.token_ids, s.loss_mask, strict=True) if m] for s in samples] == [o for o in per_segment if o]
    # a compacted reading block keeps the summary, not the chunk
    text = long_world[3].decode(compacted[0].segments[-1].token_ids)
    assert " ...\n<summary>" in text


def test_compaction_waits_until_the_context_is_full(long_world):
    agent = preset_agent()
    records, trajs, _ = run_expert(long_world, PERFECT, agent)
    for r, t in zip(records, trajs, strict=True):
        if r.metadata["hops"] <= 2:
            assert t.counters.get("compactions", 0) == 0 and len(t.segments) == 1
    every_read = preset_agent(style_options={**agent.style_options, "compact_when": "read"})
    _, eager, _ = run_expert(long_world, PERFECT, every_read)
    assert sum(t.counters["compactions"] for t in eager) == sum(t.counters["read_turns"] for t in eager)
    assert all(t.finish == "answer" for t in trajs)


def test_a_70000_character_page_is_read_and_answered_with_the_default_settings(make_tokenizer):
    """The default agent (asearcher style) reads a long web page chunk by chunk and answers from its own
    summary of the last chunk; without compaction the same episode runs out of context."""
    words = [f"filler{i % 97}" for i in range(8_000)]
    contents = " ".join(words[:7_000]) + " The vault code is Kestrel. " + " ".join(words[7_000:])
    assert 70_000 <= len(contents) <= 75_000  # three chunks of 25,000 characters, the code in the last
    page = Page(url="https://long.test/page", title="Long page", contents=contents)
    tok = make_tokenizer([contents[:20_000], "<access></access><answer></answer><summary></summary> The vault code is"], vocab_size=600)

    class Pages:
        def get(self, url):
            return page if url == page.url else None

        def __len__(self):
            return 1

    class NoSearch:
        name = "none"

        def search(self, queries, topk):
            return [[] for _ in queries]

    def reader(prompt: str) -> str:
        if prompt.endswith("<summary>"):
            m = re.search(r"vault code is (\w+)", prompt.rsplit("<information>", 1)[1])
            return (f"The code is {m.group(1)}." if m else "Nothing yet.") + "</summary>"
        found = re.findall(r"<summary>The code is (\w+)\.", prompt)
        return f"<answer>{found[-1]}</answer>" if found else f"<access>{page.url}</access>"

    tools = {"search": SearchTool(NoSearch()), "access": AccessTool(Pages())}

    def episode(cfg: AgentConfig):
        return asyncio.run(run_episode(ScriptedEngine(tok, reader), tok, tools, "What is the vault code?", cfg))

    traj = episode(AgentConfig())
    assert traj.finish == "answer" and traj.answer == "Kestrel"
    assert traj.counters["read_turns"] == 3 and traj.counters["compactions"] == 3
    short = episode(AgentConfig(max_context_tokens=8192, style_options={"compact_read_blocks": None}))
    assert short.finish == "max_tokens" and short.answer is None
