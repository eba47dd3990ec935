"""An agent written against the OpenAI client, run as a rollout workflow: `workflow.kind: openai_agent`.

    async def agent(client: openai.AsyncOpenAI, item: EpisodeItem) -> str | float | None: ...

The agent gets a client pointed at its episode's training session (`openai_session`) and the question
(`item.question`, `.id`, `.metadata`). It returns its answer (scored against the item's golds with the
configured reward: EM/F1/CEM, the format gate seeing malformed tool calls), a number (its own reward), or
None (no answer). Every completion it made becomes a training segment sharing the episode's reward, with
the built-in agent's staleness bound, loss, infrastructure-fault masking and metrics.

Against an engine that is itself an OpenAI-compatible endpoint (`engine.kind: openai`: a vLLM server, a
hosted API) the same function gets a plain client to that endpoint, for evaluation: nothing is recorded.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from asearch.agent.loop import AgentConfig
from asearch.agent.openai_session import CURRENT_TOOLS, EpisodeSession, EpisodeTools, SessionRouter
from asearch.agent.trajectory import FinishReason, Trajectory
from asearch.agent.workflow import REJECT_BY_DEFAULT, EpisodeItem, SearchAgentWorkflow, ToolChooser
from asearch.config import Config
from asearch.engine.types import Engine, Tokenizer
from asearch.errors import ConfigError
from asearch.metrics.reward import RewardConfig, compute_reward
from asearch.tools import Tool

log = logging.getLogger(__name__)

AgentFn = Callable[[Any, EpisodeItem], Awaitable[Any]]
ANSWER_TAGS = ("answer",)


class WorkflowConfig(Config):
    """Which agent runs the episodes of training and evaluation."""

    kind: Literal["search_agent", "openai_agent"] = Field(
        "search_agent",
        description="search_agent: asearch's own loop (agent.style, the tools as action tags); openai_agent: an "
        "async function written against the openai client (`agent`), served by the policy engine (docs/agents-openai.md).",
    )
    agent: str | None = Field(
        None, description="openai_agent: the function as 'pkg.module:function' (a module on the Python path, or "
        "'path/to/file.py:function'); `async def f(client, item) -> answer | reward | None`.",
    )

    sessions: Literal["in_process", "loopback"] = Field(
        "in_process", description="openai_agent: how the agent's client reaches its episode's session: in_process "
        "(httpx's ASGI transport, no socket) or loopback (an HTTP server on a free 127.0.0.1 port, for agents that "
        "talk to `client.base_url` with their own HTTP stack or framework).",
    )

    turn_discount: float = Field(
        1.0, gt=0.0, le=1.0, description="openai_agent: each completion is trained as its own segment with the "
        "episode's advantage times turn_discount ** (completions after it); 1: no discount, and completions that "
        "extend one another share a segment.",
    )

    @model_validator(mode="after")
    def _agent_named(self) -> WorkflowConfig:
        if self.kind == "openai_agent" and not self.agent:
            raise ValueError("workflow.kind=openai_agent needs workflow.agent='pkg.module:function'")
        return self


def load_agent(spec: str) -> AgentFn:
    """The function `spec` names: 'pkg.module:function' or 'path/to/file.py:function'."""
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise ConfigError(f"workflow.agent={spec!r}: write it as 'pkg.module:function'")
    try:
        if module_name.endswith(".py"):
            loc = importlib.util.spec_from_file_location(os.path.basename(module_name)[:-3], module_name)
            if loc is None or loc.loader is None:
                raise ImportError(f"cannot load {module_name}")
            module = importlib.util.module_from_spec(loc)
            loc.loader.exec_module(module)
        else:
            module = importlib.import_module(module_name)
    except (ImportError, OSError) as e:
        raise ConfigError(f"workflow.agent={spec!r}: cannot import {module_name}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"workflow.agent={spec!r}: {module_name} has no async function {attr!r}")
    return fn


class OpenAIAgentWorkflow:
    """`RolloutWorkflow` over an OpenAI-client agent function: one training session per episode."""

    def __init__(
        self,
        agent: AgentFn | str,
        tokenizer: Tokenizer,
        cfg: AgentConfig,
        reward: RewardConfig | None = None,
        tools: Mapping[str, Tool] | ToolChooser | None = None,
        *,
        reject_finishes: Collection[FinishReason] = REJECT_BY_DEFAULT,
        sessions: Literal["in_process", "loopback"] = "in_process",
        turn_discount: float = 1.0,
    ):
        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.sessions, self.turn_discount = sessions, turn_discount
        self.tokenizer, self.cfg, self.reward = tokenizer, cfg, reward or RewardConfig()
        self._choose_tools: ToolChooser = tools if callable(tools) else (lambda item: tools or {})
        self.reject_finishes = frozenset(reject_finishes)
        self.rejected: Counter[str] = Counter()
        self.router = SessionRouter()

    def tools_for(self, item: Any) -> Mapping[str, Tool]:
        return self._choose_tools(EpisodeItem.of(item))

    async def arun_episode(
        self, engine: Engine, item: Any, *, seed: int | None = None, trajectory_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> Trajectory | None:  # fmt: skip
        """Run the agent on the item in its own session, then score it; None when the engine aborted it."""
        q = EpisodeItem.of(item)
        tools = self._choose_tools(q)
        traj = Trajectory(
            id=trajectory_id or f"{q.id}-{random.getrandbits(32):08x}", question=q.question, style="openai_agent",
            action_tags=[*tools, *ANSWER_TAGS], metadata=dict(metadata) if metadata is not None else {"id": q.id},
        )  # fmt: skip
        result = await self._run_agent(engine, q, traj, tools, seed)
        self.score(traj, q, result)
        if traj.finish in self.reject_finishes:
            self.rejected[traj.finish] += 1
            return None
        return traj

    async def _run_agent(self, engine: Engine, q: EpisodeItem, traj: Trajectory, tools: Mapping[str, Tool], seed: int | None) -> Any:
        """The agent's result; its failures end the episode (finish abort, max_turns, max_tokens or error)."""
        session = EpisodeSession(engine, self.tokenizer, traj, self.cfg, seed=seed, split_calls=self.turn_discount < 1.0)
        remote = _remote_client(engine)
        if remote is None and self.sessions == "loopback":
            await self.router.serve_loopback()
        sid = None if remote is not None else self.router.open(session)
        client = remote if sid is None else self.router.client(sid)
        token = CURRENT_TOOLS.set(EpisodeTools(tools, traj, self.cfg.tool_timeout_s))
        t0, result = time.perf_counter(), None
        try:
            result = await self.agent(client, q)
            traj.finish = "answer" if result is not None else "max_turns"  # None: it gave up, as out of turns
        except Exception as e:  # noqa: BLE001 - the agent's code, or an API error it did not handle
            traj.finish = (
                "abort" if session.aborted else "max_turns" if session.calls_refused
                else "max_tokens" if session.context_exceeded else "error"
            )  # fmt: skip
            traj.metadata["agent_error"] = f"{type(e).__name__}: {e}"[:500]
            if traj.finish == "error":
                traj.count("agent_errors")
                log.warning("agent %s failed on %s: %s", getattr(self.agent, "__name__", "?"), q.id, traj.metadata["agent_error"])
        finally:
            CURRENT_TOOLS.reset(token)
            if sid is not None:
                self.router.close(sid)
            await client.close()
        session.finish_counters()
        if self.turn_discount < 1.0:  # one segment per completion: the last counts fully, each earlier one less
            for t, turn in enumerate(traj.turns):
                traj.segments[turn.segment].advantage_scale = self.turn_discount ** (traj.num_turns - 1 - t)
        traj.wall_s = time.perf_counter() - t0
        return result

    def score(self, traj: Trajectory, item: Any, result: Any) -> Trajectory:
        """An answer is scored against the golds (`compute_reward`); a number is the agent's own reward."""
        q = EpisodeItem.of(item)
        if isinstance(result, int | float) and not isinstance(result, bool):
            traj.reward = traj.score = float(result)
            traj.reward_reason = "the agent's reward"
            return traj
        traj.answer = None if result is None else str(result)
        scored = compute_reward(traj, q.golds, self.reward, q.aug_golds)
        traj.reward, traj.score, traj.reward_reason = scored.reward, scored.score, scored.reason
        return traj


def _remote_client(engine: Engine) -> Any:
    """A plain `openai.AsyncOpenAI` to the endpoint an `openai`-kind engine talks to (evaluation against a vLLM
    server or a hosted API: nothing to record), else None."""
    from asearch.engine.remote.openai_chat import OpenAIChatEngine

    if not isinstance(engine, OpenAIChatEngine):
        return None
    import openai

    chat = engine.client
    key = os.environ.get(chat.api_key_env) or "unused"
    return openai.AsyncOpenAI(base_url=str(chat.base_url), api_key=key)


def make_workflow(
    cfg: WorkflowConfig, tokenizer: Tokenizer, tools: Mapping[str, Tool] | ToolChooser, agent: AgentConfig,
    reward: RewardConfig | None = None,
) -> SearchAgentWorkflow | OpenAIAgentWorkflow:  # fmt: skip
    """The rollout workflow `cfg` names, over `tools` with the agent's limits and sampling and `reward`."""
    if cfg.kind == "openai_agent":
        assert cfg.agent is not None
        return OpenAIAgentWorkflow(
            cfg.agent, tokenizer, agent, reward, tools, sessions=cfg.sessions, turn_discount=cfg.turn_discount
        )
    return SearchAgentWorkflow(tokenizer, tools, agent, reward)
