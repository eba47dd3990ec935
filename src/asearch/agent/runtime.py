"""Assemble a ready agent from config: engine + tokenizer + tools (+ the index they need), and close them.

`ask`, `eval` and synthesis measurement start here; `train` builds its own (a trainer, rollout servers) from
the same YAML sections (`engine`, `tools`, `agent`), so one shape drives them all.
The tools search a local corpus / index, a retrieval server, or the open web (`tools.web`, see docs/web.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import Field

from asearch.agent.loop import AgentConfig, run_episode
from asearch.agent.trajectory import Trajectory
from asearch.config import Config
from asearch.engine.registry import EngineConfig, build_engine
from asearch.engine.types import Engine, Tokenizer
from asearch.tools import Tool, ToolsConfig, build_tools, close_all


class RuntimeConfig(Config):
    engine: EngineConfig = Field(default_factory=EngineConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)


@dataclass
class Runtime:
    engine: Engine
    tokenizer: Tokenizer
    tools: dict[str, Tool]
    agent_cfg: AgentConfig
    _closers: list[Any] = field(default_factory=list)

    async def run(self, question: str, **kwargs: Any) -> Trajectory:
        return await run_episode(self.engine, self.tokenizer, self.tools, question, self.agent_cfg, **kwargs)

    async def close(self) -> None:
        """Close the tools' sources and the engine, the last opened first; every one runs even when one raises."""
        await close_all(self._closers)


# Instruct models too small to drive the tag protocol on their own (aliases, lower case).
SMALL_INSTRUCT_MODELS = frozenset({"smollm2-135m-instruct"})


def apply_model_style_default(cfg: RuntimeConfig) -> str | None:
    """Give a small instruct model the `guided` style (it opens the model's turns for it) unless the config
    chose a style itself. Returns a note for the user when it switched, else None."""
    if "style" in cfg.agent.model_fields_set or cfg.engine.model.lower() not in SMALL_INSTRUCT_MODELS:
        return None
    cfg.agent.style = "guided"
    return f"{cfg.engine.model}: using the 'guided' agent style (set agent.style or --style to override)"


def build_runtime(cfg: RuntimeConfig, *, progress: bool = True, record_dir: Path | None = None) -> Runtime:
    """Everything one agent needs; the tools' answers are recorded in `record_dir` (see `build_tools`). Call
    `await runtime.close()` when done."""
    tools, closers = build_tools(cfg.tools, progress=progress, record_dir=record_dir)
    engine, tokenizer = build_engine(cfg.engine)
    return Runtime(engine, tokenizer, tools, cfg.agent, [*closers, engine.close])
