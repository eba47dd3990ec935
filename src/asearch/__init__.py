"""asearch: long-horizon LLM search agents trained with fully asynchronous RL.

The names below are the public API: `from asearch import TrainConfig, train, run_eval, Engine, register_tool`.
Each is imported on first use (module `__getattr__`), so `import asearch` stays fast and loads no torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    # configs: every one loads from YAML plus `a.b=value` overrides through `load_config`
    "AgentConfig": "asearch.agent.loop",
    "Config": "asearch.config",
    "EngineConfig": "asearch.engine.registry",
    "EvalConfig": "asearch.eval.config",
    "EvalRunConfig": "asearch.eval.job",
    "RuntimeConfig": "asearch.agent.runtime",
    "SynthConfig": "asearch.synth.config",
    "ToolsConfig": "asearch.tools.build",
    "TrainConfig": "asearch.launch.train",
    "load_config": "asearch.config",
    # what the commands run
    "build_engine": "asearch.engine.registry",
    "build_runtime": "asearch.agent.runtime",
    "run_episode": "asearch.agent.loop",
    "run_eval": "asearch.eval.job",
    "run_synthesis": "asearch.synth.pipeline",
    "train": "asearch.launch.train",
    # the seams a new part implements
    "Engine": "asearch.engine.types",
    "GenerateRequest": "asearch.engine.types",
    "GenerateResponse": "asearch.engine.types",
    "SamplingParams": "asearch.engine.types",
    "Tokenizer": "asearch.engine.types",
    "EpisodeContext": "asearch.tools.base",
    "Observation": "asearch.tools.base",
    "Tool": "asearch.tools.base",
    "RolloutWorkflow": "asearch.agent.workflow",
    "SearchAgentWorkflow": "asearch.agent.workflow",
    "AgentStyle": "asearch.agent.styles",
    "Trajectory": "asearch.agent.trajectory",
    "Turn": "asearch.agent.trajectory",
    # registration: a module with one of these decorators is found by name, no other file edited
    "register_correction": "asearch.rl.loss",
    "register_engine": "asearch.engine.registry",
    "register_estimator": "asearch.rl.advantages",
    "register_launcher": "asearch.launch.registry",
    "register_reader": "asearch.web.registry",
    "register_search_provider": "asearch.web.registry",
    "register_style": "asearch.agent.styles",
    "register_tool": "asearch.tools.registry",
    # errors a user can meet
    "AsearchError": "asearch.errors",
    "ConfigError": "asearch.errors",
    "DataFormatError": "asearch.errors",
    "LaunchError": "asearch.errors",
    "RemoteError": "asearch.errors",
    "ToolError": "asearch.errors",
    "TrainingDiverged": "asearch.errors",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'asearch' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once: later lookups do not come back here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

