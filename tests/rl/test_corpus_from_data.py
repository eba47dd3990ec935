"""`corpus_from_data`: each training question is searched in the world its record names."""

from __future__ import annotations

import asyncio

import pytest

from asearch.errors import ConfigError
from asearch.eval.builtin import WorldSetSpec, world_questions
from asearch.launch.train import TrainConfig, _tools_per_corpus
from asearch.tools import ToolsConfig, run_tool


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
    closers: list = []
    tools_of = _tools_per_corpus(cfg, a + b, {"search": None}, closers)
    assert sorted(tools_of) == sorted({a[0]["metadata"]["corpus"], b[0]["metadata"]["corpus"]})
    assert tools_of[a[0]["metadata"]["corpus"]] == {"search": None}  # the run's own tools are reused
    for r in b:  # world 2's first-hop statement comes back from world 2's index (same names, other facts)
        ev = r["metadata"]["evidence"][0]
        obs = asyncio.run(run_tool(tools_of[r["metadata"]["corpus"]]["search"], ev["entity"]))
        assert ev["statement"] in obs.text, (ev, obs.text)
    assert closers  # the extra indexes are closed with the run


def test_records_without_a_corpus_are_refused_with_their_id() -> None:
    cfg = TrainConfig(
        model="m", data="q.jsonl", corpus_from_data=True, tools=ToolsConfig(corpus="world:1", access=None)
    )
    rec = {"id": "q7", "question": "?", "golds": ["x"], "metadata": {}}
    with pytest.raises(ConfigError, match="q.jsonl: record 'q7' names no corpus"):
        _tools_per_corpus(cfg, [rec], {}, [])
    with pytest.raises(ValueError, match="corpus_from_data builds a local index"):
        TrainConfig(
            model="m",
            data="q.jsonl",
            corpus_from_data=True,
            tools=ToolsConfig(server_url="http://127.0.0.1:1"),
        )
