"""The demo's set-up jobs: the same questions, indexes and expert samples in worker processes as in this one."""

from __future__ import annotations

import pytest

from asearch.agent.loop import AgentConfig
from asearch.demo.worlds import (
    ExpertJob,
    ExpertMistakes,
    WorldJob,
    expert_episodes,
    interleave,
    prepare_world,
    spread,
    worker_pool,
    world_records,
)
from asearch.tools import ToolsConfig

pytest.importorskip("torch")


def test_interleave_lets_the_worlds_take_turns() -> None:
    assert interleave([[1, 4, 7], [2, 5], [3, 6]]) == [1, 2, 3, 4, 5, 6, 7]
    assert interleave([]) == []


def test_expert_episodes_cover_every_question_group_evenly() -> None:
    """The long preset: 300 records per world grouped by hop count (50 each of 1-6), 240 episodes. Taking the first
    240 left every 6-hop question out of SFT; spread picks 40 of each hop count."""
    hops = [1 + i // 50 for i in range(300)]
    picked = [hops[i] for i in spread(300, 240)]
    assert {h: picked.count(h) for h in range(1, 7)} == {h: 40 for h in range(1, 7)}
    assert spread(3, 7) == [0, 0, 0, 1, 1, 2, 2] and spread(4, 4) == [0, 1, 2, 3] and spread(0, 5) == []
    many = spread(1200, 960)  # the default demo: 400 of each of 3 hop counts, 960 episodes
    assert [sum(1 for i in many if i // 400 == h) for h in range(3)] == [320, 320, 320]


def test_two_worker_processes_give_what_one_process_gives(tmp_path, monkeypatch) -> None:
    from asearch.demo.pipeline import DEMO_STYLE
    from asearch.models.tiny import train_bpe_tokenizer

    monkeypatch.setenv("ASEARCH_CACHE", str(tmp_path / "cache"))  # workers inherit it: fresh indexes
    tools = [ToolsConfig(corpus=f"world:seed={s},entities=150,names=9,pages=facts", search={"topk": 2, "compact": True, "show_urls": False}, access=None) for s in (1, 257)]
    jobs = [WorldJob(s, 150, 12, (1, 2, 3), "t", 9, "facts", True, tc) for s, tc in zip((1, 257), tools, strict=True)]
    with worker_pool(1) as one:
        records = one(prepare_world, jobs)
    assert [len(r) for r in records] == [12, 12] and sorted({r.metadata["hops"] for r in records[0]}) == [1, 2, 3]
    assert len(list((tmp_path / "cache" / "indexes").iterdir())) == 2  # both indexes built into the cache
    tok = train_bpe_tokenizer((r.question for rs in records for r in rs), vocab_size=300)
    agent = AgentConfig(style="search-r1", style_options=DEMO_STYLE, max_turns=4, max_new_tokens=48, max_context_tokens=1024)
    experts = [ExpertJob(rs, 15, tc, tok, agent, ExpertMistakes(p_skip=0.5, p_wrong=0.25), 7 + k) for k, (rs, tc) in enumerate(zip(records, tools, strict=True))]
    with worker_pool(2) as two:
        assert [[r.question for r in rs] for rs in two(prepare_world, jobs)] == [[r.question for r in rs] for rs in records]
        in_workers = two(expert_episodes, experts)
    with worker_pool(1) as one:
        here = one(expert_episodes, experts)
    assert [len(e) for e in here] == [15, 15]
    flat = lambda runs: [(s.token_ids, s.loss_mask) for world in runs for ep in world for s in ep]  # noqa: E731
    assert flat(in_workers) == flat(here) and all(sum(m) for _, m in flat(here))
    searched = [tok.decode(s.token_ids) for ep in here[0] for s in ep]
    assert all("<search>" in t and "<answer>" in t for t in searched)  # the expert searched, then answered


def test_the_tokenizer_of_the_long_preset_sees_whole_expert_episodes() -> None:
    """The tokenizer is fitted on expert episodes spelled byte by byte: they must run to their answers (a url
    spelled in bytes outgrew an action's token budget and cut every episode at its first `access`)."""
    from asearch.config import load_config
    from asearch.demo.pipeline import DemoConfig, _episode_texts, _Layout, _tools_over, _world
    from asearch.demo.presets import preset
    from asearch.tools import ensure_index

    cfg = load_config(DemoConfig, None, ["world_entities=300"], base=preset("long"))
    layout = _Layout.of(cfg)
    seed = layout.tokenizer_seeds[0]
    records = world_records(seed, 300, 12, cfg.hops, "t", cfg.names, cfg.pages, True)
    tools = _tools_over(cfg, seed)
    ensure_index(tools.corpus or "", tools.build, progress=False)
    texts = _episode_texts(_world(cfg, seed, 300), records, cfg, layout)
    episodes = [t for t in texts if "Question:" in t]
    assert len(episodes) == len(records)
    assert all(t.rstrip().endswith("</answer>") and "</access>" in t and "</summary>" in t for t in episodes)
