"""`corpus_from_data`: each training question is searched in the world its record names."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from asearch.errors import ConfigError
from asearch.eval.builtin import WorldSetSpec, world_questions
from asearch.launch.train import TrainConfig, _tools_per_corpus
from asearch.tools import ToolsConfig, open_tools, run_tool


def _records(seed: int) -> list[dict]:
    spec = WorldSetSpec(seed=seed, n=6, hops=(1,), entities=300, names=9, pages="facts")
    return [r.model_dump(mode="json") for r in world_questions(spec, dataset=f"w{seed}")]


def test_each_record_gets_the_tools_of_its_own_world() -> None:
    a, b = _records(1), _records(2)
    search = {"topk": 1, "show_urls": False, "compact": True}
    cfg = TrainConfig(
        model="m",
        data="x.jsonl",
        corpus_from_data=True,
        tools=ToolsConfig(corpus=a[0]["metadata"]["corpus"], search=search, access=None),
    )
    opened: list[str] = []

    async def go() -> tuple[dict, dict]:
        async with contextlib.AsyncExitStack() as stack:  # the run's stack: extra indexes close with the run

            async def open_on_stack(tools_cfg: ToolsConfig):
                opened.append(tools_cfg.corpus)
                return await stack.enter_async_context(open_tools(tools_cfg, progress=False))

            tools_of = await _tools_per_corpus(cfg, a + b, {"search": None}, open_on_stack)
            # world 2's first-hop statement comes back from world 2's index (same names, other facts)
            obs = {}
            for r in b:
                search_tool = tools_of[r["metadata"]["corpus"]]["search"]
                obs[r["id"]] = await run_tool(search_tool, r["metadata"]["evidence"][0]["entity"])
            return tools_of, obs

    tools_of, obs = asyncio.run(go())
    assert sorted(tools_of) == sorted({a[0]["metadata"]["corpus"], b[0]["metadata"]["corpus"]})
    assert tools_of[a[0]["metadata"]["corpus"]] == {"search": None}  # the run's own tools are reused
    assert opened == [b[0]["metadata"]["corpus"]]  # only the other world's tools are opened
    for r in b:
        ev = r["metadata"]["evidence"][0]
        assert ev["statement"] in obs[r["id"]].text, (ev, obs[r["id"]].text)


def test_records_without_a_corpus_are_refused_with_their_id() -> None:
    cfg = TrainConfig(
        model="m", data="q.jsonl", corpus_from_data=True, tools=ToolsConfig(corpus="world:1", access=None)
    )
    rec = {"id": "q7", "question": "?", "golds": ["x"], "metadata": {}}
    with pytest.raises(ConfigError, match="q.jsonl: record 'q7' names no corpus"):
        asyncio.run(_tools_per_corpus(cfg, [rec], {}, open_tools))
    with pytest.raises(ValueError, match="corpus_from_data builds a local index"):
        TrainConfig(
            model="m",
            data="q.jsonl",
            corpus_from_data=True,
            tools=ToolsConfig(server_url="http://127.0.0.1:1"),
        )
