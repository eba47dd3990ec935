"""The rollout workflow: the agent on an item, scored inside (typed fields), rejections counted by cause."""

from __future__ import annotations

import asyncio

import pytest

from asearch.agent import AgentConfig
from asearch.agent.workflow import EpisodeItem, SearchAgentWorkflow, run_workflow
from asearch.engine.local.scripted import ScriptedEngine
from asearch.engine.types import GenerateResponse
from asearch.metrics.reward import RewardConfig
from asearch.tools import EpisodeContext, Observation


@pytest.fixture(scope="module")
def tok(make_tokenizer):
    return make_tokenizer(["Where was Ada Varn born? Oslen Kettering"] * 20 + ["<search></search><answer></answer><think></think>"] * 20)


class _Echo:
    """A search tool that says which corpus it searches."""

    description = "<search>query</search> says which corpus it searched"

    def __init__(self, corpus: str):
        self.corpus, self.name = corpus, "search"

    def parse(self, raw: str) -> str:
        return raw

    async def call(self, args: str, episode: EpisodeContext) -> Observation:
        return Observation(text=f"[Doc 1] {self.corpus}")


def _engine(tok, answer: str) -> ScriptedEngine:
    return ScriptedEngine(tok, lambda prompt: f"<answer>{answer}</answer>")


AGENT = AgentConfig(style="search-r1", max_turns=3, max_new_tokens=16)
ITEM = {"id": "q1", "question": "Where was Ada Varn born?", "golds": ["Oslen"], "metadata": {"corpus": "a"}}


def test_the_reward_is_computed_inside_and_stored_in_typed_fields(tok) -> None:
    flow = SearchAgentWorkflow(tok, {}, AGENT, RewardConfig(metric="em"))
    right = asyncio.run(flow.arun_episode(_engine(tok, "Oslen"), ITEM))
    wrong = asyncio.run(flow.arun_episode(_engine(tok, "Kettering"), ITEM))
    assert (right.reward, right.score, right.reward_reason) == (1.0, 1.0, "ok")
    assert (wrong.reward, wrong.score) == (0.0, 0.0) and "score" not in wrong.metadata
    assert right.metadata == {"id": "q1"} and right.id.startswith("q1-") and right.id != wrong.id
    assert EpisodeItem.of(ITEM) == EpisodeItem(id="q1", question=ITEM["question"], golds=("Oslen",), metadata={"corpus": "a"})


def test_paraphrase_golds_count_as_the_reward_says(tok) -> None:
    item = {**ITEM, "golds": ["Oslen city"], "aug_golds": ["Oslen"]}
    flow = SearchAgentWorkflow(tok, {}, AGENT, RewardConfig(metric="em", aug_weight=0.5))
    traj = asyncio.run(flow.arun_episode(_engine(tok, "Oslen"), item))
    assert traj.score == pytest.approx(0.5)  # (1 - w) * 0 + w * max(0, 1)


def test_a_tool_chooser_gives_each_item_its_own_tools(tok) -> None:
    seen: list[str] = []

    def policy(prompt: str) -> str:
        if "[Doc 1]" in prompt:
            seen.append(prompt.rsplit("[Doc 1] ", 1)[1][:1])
            return "<answer>Oslen</answer>"
        return "<search>Ada</search>"

    tools = {"a": {"search": _Echo("a")}, "b": {"search": _Echo("b")}}
    flow = SearchAgentWorkflow(tok, lambda item: tools[item.metadata["corpus"]], AGENT)
    items = [ITEM, {**ITEM, "id": "q2", "metadata": {"corpus": "b"}}]
    trajs = asyncio.run(run_workflow(flow, ScriptedEngine(tok, policy), items, concurrency=1))
    assert seen == ["a", "b"] and [t.metadata["id"] for t in trajs] == ["q1", "q2"]


def test_an_aborted_episode_is_rejected_and_counted(tok) -> None:
    class Aborting(ScriptedEngine):
        async def generate(self, request):
            return GenerateResponse(output_ids=[], output_logprobs=[], output_versions=[], stop_reason="abort")

    flow = SearchAgentWorkflow(tok, {}, AGENT)
    assert asyncio.run(flow.arun_episode(Aborting(tok, str), ITEM)) is None
    assert flow.rejected == {"abort": 1}
    keep = SearchAgentWorkflow(tok, {}, AGENT, reject_finishes=())
    assert asyncio.run(keep.arun_episode(Aborting(tok, str), ITEM)).finish == "abort" and not keep.rejected
