"""The rollout workflow seam: `await workflow.arun_episode(engine, item)` -> a scored Trajectory, or None.

Everything that runs episodes goes through one (training, held-out evaluation, the eval runner, synthesis
measurement, the demo): the caller hands it an engine and a question, the workflow runs the agent and
scores the result, so the reward is computed in one place and stored in typed fields (`Trajectory.reward`,
`.score`, `.reward_reason`). None means the episode must not be used (trained on or scored); the workflow
counts each rejection by cause in `rejected`.

    workflow = SearchAgentWorkflow(tokenizer, tools, AgentConfig(), RewardConfig(metric="em"))
    traj = await workflow.arun_episode(engine, record)   # record: a QARecord (or its jsonl dict)
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from asearch.agent.loop import AgentConfig, Tokenizer, run_episode
from asearch.agent.trajectory import FinishReason, Trajectory
from asearch.engine.types import Engine
from asearch.metrics.reward import RewardConfig, compute_reward
from asearch.tools import Tool

__all__ = ["EpisodeItem", "RolloutWorkflow", "SearchAgentWorkflow", "ToolChooser", "run_workflow"]


class RolloutWorkflow(Protocol):
    """One episode on one item with the engine it is handed; None rejects it, counted in `rejected`. `seed`
    fixes the episode's sampling (None: the engine's own stream), so a training run samples the same tokens
    whatever order its requests reach the engine in."""

    @property
    def rejected(self) -> Mapping[str, int]:
        """Rejected episodes by cause, since the workflow was made."""
        ...

    async def arun_episode(self, engine: Engine, item: Any, *, seed: int | None = None) -> Trajectory | None: ...


@dataclass(frozen=True, slots=True)
class EpisodeItem:
    """The fields of a question the search workflow reads (those of `asearch.eval.QARecord`)."""

    id: str
    question: str
    golds: Sequence[str]
    aug_golds: Sequence[str] = ()
    dataset: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, item: Any) -> EpisodeItem:
        """A QARecord (or anything with its fields), or its jsonl dict as training checkpoints store it."""
        get: Callable[..., Any] = item.get if isinstance(item, Mapping) else lambda key, default=None: getattr(item, key, default)
        return cls(
            id=str(get("id")), question=get("question"), golds=tuple(get("golds") or ()),
            aug_golds=tuple(get("aug_golds") or ()), dataset=get("dataset", "") or "", metadata=get("metadata") or {},
        )  # fmt: skip


ToolChooser = Callable[[EpisodeItem], Mapping[str, Tool]]  # per item, e.g. the tools over its own corpus
REJECT_BY_DEFAULT: tuple[FinishReason, ...] = ("abort",)  # the engine cut the last turn off (e.g. shutdown)


class SearchAgentWorkflow:
    """The search agent (`agent.loop.run_episode`) on an item's question, scored against its golds.

    `tools` is one tool set, or a function choosing one per item (training on many corpora at once).
    Episodes whose `finish` is in `reject_finishes` are rejected: by default "abort" (the engine cut the
    last turn off, e.g. on shutdown; it says nothing about the policy)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        tools: Mapping[str, Tool] | ToolChooser,
        agent: AgentConfig,
        reward: RewardConfig | None = None,
        *,
        reject_finishes: Collection[FinishReason] = REJECT_BY_DEFAULT,
    ):
        self.tokenizer, self.agent, self.reward = tokenizer, agent, reward or RewardConfig()
        self._choose_tools: ToolChooser = tools if callable(tools) else (lambda item: tools)
        self.reject_finishes = frozenset(reject_finishes)
        self.rejected: Counter[str] = Counter()

    def tools_for(self, item: Any) -> Mapping[str, Tool]:
        return self._choose_tools(EpisodeItem.of(item))

    async def arun_episode(
        self,
        engine: Engine,
        item: Any,
        *,
        seed: int | None = None,
        trajectory_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Trajectory | None:
        """Run and score one episode. The default id is unique per episode (the engines key their prefix
        cache by it, so the samples of a group must not share one); `metadata` defaults to the item's id."""
        q = EpisodeItem.of(item)
        traj = await run_episode(
            engine, self.tokenizer, self._choose_tools(q), q.question, self.agent, seed=seed,
            trajectory_id=trajectory_id or f"{q.id}-{random.getrandbits(32):08x}",
            metadata=dict(metadata) if metadata is not None else {"id": q.id},
        )  # fmt: skip
        self.score(traj, q)
        if traj.finish in self.reject_finishes:
            self.rejected[traj.finish] += 1
            return None
        return traj

    def score(self, traj: Trajectory, item: Any) -> Trajectory:
        """Fill `traj.reward`, `.score` and `.reward_reason` from the item's golds (and paraphrases); the
        format gate knows the actions the trajectory's agent had (`traj.action_tags`: its tools and answer)."""
        q = EpisodeItem.of(item)
        result = compute_reward(traj, q.golds, self.reward, q.aug_golds)
        traj.reward, traj.score, traj.reward_reason = result.reward, result.score, result.reason
        return traj


async def run_workflow(
    workflow: RolloutWorkflow, engine: Engine, items: Sequence[Any], *, concurrency: int
) -> list[Trajectory | None]:
    """Every item's episode, at most `concurrency` at once, in the items' order."""
    limit = asyncio.Semaphore(concurrency)

    async def one(item: Any) -> Trajectory | None:
        async with limit:
            return await workflow.arun_episode(engine, item)

    return list(await asyncio.gather(*(one(item) for item in items)))
