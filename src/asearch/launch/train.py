"""`asearch train`: a `TrainConfig` turned into what the RL loop runs on, then the loop.

    records, tools -> workflows (training, held-out) -> launcher (if any) -> trainer -> resume
    -> engine (in-process, or a pool over rollout servers) + how weights reach it -> `TrainingLoop`

The engine is in-process by default; with `rollout_servers` it is a pool of rollout servers (given by
URL, or started by the launcher `launcher` names) that load each version from RUN/weights/vN. A launcher
may also place the trainer (`launcher=ray`: `allocation.trainer_ranks` FSDP ranks on the cluster).
Everything started here is stopped on the way out, error or Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import difflib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from pydantic import (
    Field,
    SerializeAsAny,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from asearch.agent.loop import AgentConfig
from asearch.agent.openai_workflow import WorkflowConfig, make_workflow
from asearch.agent.workflow import EpisodeItem, RolloutWorkflow
from asearch.engine.local.inprocess import InProcessEngine
from asearch.engine.registry import EngineConfig
from asearch.engine.remote.pool import EnginePool, RolloutServersConfig, open_pool
from asearch.engine.types import Engine, Tokenizer
from asearch.errors import ConfigError
from asearch.launch.registry import launcher_names, launcher_type, make_launcher
from asearch.launch.spec import Allocation, Launcher, server_tensor_parallel
from asearch.metrics.reward import RewardConfig
from asearch.rl.checkpoint import resume_from_checkpoint
from asearch.rl.loop import EvalSchedule, LoopConfig, TrainingLoop, write_summary
from asearch.rl.trainer import PolicyTrainer, Trainer
from asearch.rl.weights import CollectiveWeights, DiskWeights, LiveWeights, WeightSync, weight_metrics
from asearch.runs import RunDir
from asearch.tools import Tool, ToolsConfig, open_tools, tool_metrics
from asearch.tools.replay import RECORD_DIR

Log = Callable[[str], Any]
POLICY_DIR = "policy"  # RUN/policy: the final policy, written when a run ends


class HeldoutConfig(EvalSchedule):
    """Periodic evaluation on held-out questions (greedy), for the accuracy-vs-wall-time curve."""

    dataset: str | None = Field(None, description="QA set spec or file (e.g. world:seed=200,n=100); None: no evaluation.")
    tools: ToolsConfig | None = Field(None, description="Tools for the held-out corpus (default: training tools).")
    concurrency: int = Field(64, ge=1, description="Held-out episodes running at once.")


class TrainConfig(LoopConfig):
    """One RL run: the loop's settings (`LoopConfig`: seed, rollout, trainer, steps, ...) and what it runs on."""

    out: Path | None = Field(None, description="Run directory (default runs/train-<time>).")
    model: str = Field(description="Initial policy: HF directory, name or alias.")
    trainer_threads: int = Field(
        1, ge=1, description="torch threads of the trainer (this process; under launcher=ray each rank). The "
        "in-process engine's decode thread uses engine.threads, each launched server allocation.server_threads.",
    )
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="The in-process engine (kind inprocess, over the policy being trained: `model` is its model; "
        "threads: its decode thread's); with a launcher, the servers' batch, length, dtype and prefix cache "
        "(their threads: allocation.server_threads).",
    )
    rollout_servers: RolloutServersConfig | None = Field(
        None, description="Generate on rollout servers instead of in this process (None: in-process engine)."
    )
    launcher: str = Field(
        "none",
        description="none: use the in-process engine or rollout_servers.urls; otherwise a registered launcher "
        "(asearch.launch.registry): local starts allocation.rollout_servers servers on this machine "
        "(subprocesses) for this run; ray starts the servers and allocation.trainer_ranks FSDP trainer ranks "
        "as actors on a Ray cluster.",
    )
    allocation: SerializeAsAny[Allocation] = Field(
        default_factory=Allocation,
        description="What a launcher starts: the common keys, and the launcher's own (its options model, e.g. "
        "allocation.ray_address for launcher=ray).",
    )
    device_memory_gb: float | None = Field(
        None, gt=0, description="Memory of one device (GPU, or the machine on a CPU) in GiB for the memory plan that "
        "`asearch train` checks before it starts anything (docs/plan.md). None: the visible GPU's, else this machine's "
        "RAM; trainer ranks on a Ray cluster, or a CUDA trainer where this machine has no GPU, are not checked unless "
        "it is set.",
    )
    tools: ToolsConfig = Field(default_factory=ToolsConfig, description="The agent's tools during training.")
    corpus_from_data: bool = Field(
        False,
        description="Search each training question in the corpus its record names (`metadata.corpus`, which "
        "built-in world sets carry), with `tools`' other settings; one index per corpus, built at start. "
        "Trains on many worlds at once, so a policy cannot do well by remembering one world's facts.",
    )
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The agent (its temperature samples RL).")
    workflow: WorkflowConfig = Field(
        default_factory=WorkflowConfig, description="Which agent runs the episodes: asearch's own (search_agent) or "
        "an OpenAI-client agent function (openai_agent, docs/agents-openai.md).",
    )
    data: str = Field(description="Training questions: a QA set spec or file.")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The RL reward (and the held-out metric).")
    heldout: HeldoutConfig = Field(default_factory=HeldoutConfig)

    @model_validator(mode="before")
    @classmethod
    def _engine_runs_the_policy(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        if "threads" in data:
            raise ValueError(
                "`threads` is now `trainer_threads` (the trainer's torch threads); the in-process engine's are "
                "`engine.threads` and each launched server's `allocation.server_threads`"
            )
        engine = data.get("engine") or {}
        if isinstance(engine, Mapping) and "model" not in engine and "model" in data:
            data = {**data, "engine": {**engine, "model": data["model"]}}  # the engine samples from the policy
        return data

    @field_validator("allocation", mode="wrap")
    @classmethod
    def _launcher_options(cls, value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Allocation:
        """`allocation` as the options model of the launcher `launcher` picks (Allocation plus its own keys)."""
        launcher = info.data.get("launcher", "none")
        model = launcher_type(launcher).options_model if launcher in launcher_names() else Allocation
        if isinstance(value, Allocation):
            value = value.model_dump(exclude_unset=True)
        if isinstance(value, Mapping):
            for key in (k for k in value if k not in model.model_fields):
                owners = [n for n in launcher_names() if key in launcher_type(n).options_model.model_fields]
                if owners:
                    raise PydanticCustomError(
                        "launcher_option", f"allocation.{key} is an option of launcher {owners[0]} (launcher={launcher})"
                    )
                near = difflib.get_close_matches(str(key), list(model.model_fields), n=1, cutoff=0.5)
                hint = f"; did you mean 'allocation.{near[0]}'?" if near else ""
                raise PydanticCustomError(
                    "launcher_option",
                    f"unknown key 'allocation.{key}' for launcher={launcher}{hint} (valid here: {', '.join(model.model_fields)})",
                )
        return model.model_validate(value) if model is not Allocation else handler(value)

    @model_validator(mode="after")
    def _check_servers(self) -> TrainConfig:
        if self.engine.kind != "inprocess" or self.engine.model != self.model:
            raise ValueError(
                f"engine: asearch train samples in process from the policy it trains (kind inprocess, model "
                f"{self.model!r}; got kind {self.engine.kind!r}, model {self.engine.model!r}); for servers set "
                "rollout_servers (and a launcher)"
            )
        urls = self.rollout_servers.urls if self.rollout_servers else []
        if self.launcher != "none" and self.launcher not in launcher_names():
            raise ValueError(f"unknown launcher {self.launcher!r}; choose none or one of {', '.join(launcher_names())}")
        if self.launcher != "none" and urls:
            raise ValueError(f"launcher={self.launcher} starts its own servers: drop rollout_servers.urls ({urls})")
        placing = [n for n in launcher_names() if launcher_type(n).places_trainer]
        if self.allocation.trainer_ranks > 1 and (self.launcher == "none" or not launcher_type(self.launcher).places_trainer):
            raise ValueError(
                f"allocation.trainer_ranks={self.allocation.trainer_ranks} needs a launcher that places trainer "
                f"ranks ({', '.join(placing)}); launcher={self.launcher} trains in this process"
            )
        if self.corpus_from_data and (self.tools.server_url or self.tools.web or self.tools.index):
            raise ValueError("corpus_from_data builds a local index per corpus: drop tools.server_url, tools.web and tools.index")
        if self.launcher == "none" and self.rollout_servers is not None and not urls:
            raise ValueError("rollout_servers needs urls of running servers, or launcher=local to start them")
        return self

    @model_validator(mode="after")
    def _servers_hold_the_agent_context(self) -> TrainConfig:
        """Launched rollout servers take their context length (vLLM --max-model-len, the engine server's
        --max-seq-len) from engine.max_seq_len; unset, it follows the agent's budget, and set smaller it would
        cut every episode that reaches the budget."""
        if self.launcher == "none":
            return self
        options, budget = self.engine.options, self.agent.max_context_tokens
        if "max_seq_len" not in options.model_fields_set:
            options.max_seq_len = budget
        elif options.max_seq_len < budget:
            raise ValueError(
                f"engine.max_seq_len={options.max_seq_len} (the rollout servers' context length) is smaller than "
                f"agent.max_context_tokens={budget} (the agent's context budget): raise engine.max_seq_len, lower "
                "agent.max_context_tokens, or leave engine.max_seq_len unset to follow the agent"
            )
        return self

    @property
    def servers(self) -> RolloutServersConfig | None:
        """The rollout servers' settings, or None when generation runs in this process."""
        if self.launcher == "none":
            return self.rollout_servers
        return self.rollout_servers or RolloutServersConfig()


# ---------------------------------------------------------------------------- the run


async def train(cfg: TrainConfig, *, run: RunDir, log: Log = print, model: Any = None, tokenizer: Any = None) -> dict[str, Any]:
    """Run (or resume) RL training into `run`. Returns the summary dict (also written to summary.json).
    `model` / `tokenizer`: the policy already in memory (default: loaded from `cfg.model`)."""
    from asearch.launch.plan import refuse_if_too_big
    from asearch.models.loading import load_tokenizer

    refuse_if_too_big(cfg, model=model)  # before the run directory, the launcher, the servers or the model
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.trainer_threads)
    run.save_config(cfg)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    records = load_records(cfg.data)
    async with contextlib.AsyncExitStack() as stack:  # unwinds in reverse: engine, launcher, tools
        tools, workflow, heldout_workflow, heldout = await _open_workflows(
            cfg, tokenizer, records, stack, run.path / RECORD_DIR
        )
        launcher = make_launcher(
            cfg.launcher, cfg.model, cfg.allocation, cfg.servers, engine=cfg.engine, log_dir=run.path / "logs",
            seed=cfg.seed, trainer_threads=cfg.trainer_threads, log=log,
        ) if cfg.launcher != "none" else None  # fmt: skip
        if launcher is not None:  # stopped on every exit, also when the trainer or the servers fail to start
            stack.push_async_callback(asyncio.to_thread, launcher.stop)
        trainer, n_params = await _start_trainer(cfg, launcher, model)
        resume = resume_from_checkpoint(run, trainer, log)
        engine, weights = await stack.enter_async_context(
            rollout_engine(cfg, run.path, trainer, tokenizer, resume.step, log, launcher)
        )
        B, n, eta = cfg.rollout.batch_size, cfg.rollout.group_size, cfg.rollout.max_staleness
        log(
            f"RL: {len(records)} questions, B={B} groups x n={n} samples = {B * n} trajectories/step, eta={eta} "
            f"({'synchronous' if eta == 0 else 'one-step-off' if eta == 1 else 'fully asynchronous'}), "
            f"<= {cfg.rollout.concurrency} groups in flight, {n_params:,} params"
        )
        engine_counts = EngineCounters(engine)
        loop = TrainingLoop(
            cfg, run=run, engine=engine, trainer=trainer, workflow=workflow, records=records, weights=weights,
            resume=resume, log=log,
            step_metrics=lambda: {**tool_metrics(tools, end_step=True), **engine_counts(), **weight_metrics(weights)},
            heldout=None if heldout_workflow is None else _heldout_eval(heldout_workflow, engine, heldout, cfg),
        )  # fmt: skip
        summary = await loop.run()
        # the trained policy as a model directory any engine loads (LoRA: merged, adapters in policy/adapter)
        summary["policy_dir"] = str(await asyncio.to_thread(trainer.save_hf, run.path / POLICY_DIR, tokenizer))
        if isinstance(engine, EnginePool):
            summary["rollout_servers"] = engine.stats()
    write_summary(run, summary)
    return summary


class EngineCounters:
    """Per step, what the in-process engine did since the last step (`engine/*`): tokens generated, prompt
    tokens prefilled, reused from the prefix cache and recomputed after a weight push, requests finished, and
    the mean decode batch. Where generation time goes; nothing for engines without these counters."""

    COUNTS = ("tokens_generated", "prefill_tokens", "prefix_reused_tokens", "recomputed_tokens", "requests_finished", "decode_steps")

    def __init__(self, engine: Engine):
        self.stats = getattr(engine, "stats", None)
        self.last = self._read()

    def _read(self) -> dict[str, float]:
        stats = self.stats() if callable(self.stats) else None
        return {k: float(stats[k]) for k in self.COUNTS} if isinstance(stats, Mapping) and all(k in stats for k in self.COUNTS) else {}

    def __call__(self) -> dict[str, float]:
        now = self._read()
        if not now:
            return {}
        delta = {k: now[k] - self.last.get(k, 0.0) for k in self.COUNTS}
        self.last = now
        out = {f"engine/{k}": v for k, v in delta.items() if k != "decode_steps"}
        out["engine/mean_batch"] = delta["tokens_generated"] / delta["decode_steps"] if delta["decode_steps"] else 0.0
        return out


def load_records(spec: str) -> list[dict[str, Any]]:
    """The questions of a QA set spec or file, as jsonl dicts (what checkpoints store of queued groups)."""
    from asearch.eval.datasets import load_dataset

    return [r.model_dump(mode="json") for r in load_dataset(spec)]


async def _open_workflows(
    cfg: TrainConfig, tokenizer: Tokenizer, records: Sequence[dict[str, Any]], stack: contextlib.AsyncExitStack,
    record_dir: Path,
) -> tuple[Mapping[str, Tool], RolloutWorkflow, RolloutWorkflow | None, list[Any]]:
    """(training tools, the training workflow, the held-out workflow or None, held-out records); the
    tools are opened on `stack`. Every tool records into (or replays) the run's one record, `tools.record`."""
    from asearch.eval.datasets import load_dataset

    def open_on_stack(tools_cfg: ToolsConfig) -> Awaitable[dict[str, Tool]]:
        return stack.enter_async_context(open_tools(tools_cfg, progress=False, record_dir=record_dir))

    tools = await open_on_stack(cfg.tools)
    tools_of = await _tools_per_corpus(cfg, records, tools, open_on_stack) if cfg.corpus_from_data else {}

    def choose_tools(item: EpisodeItem) -> Mapping[str, Tool]:
        return tools_of.get(item.metadata.get("corpus") or "", tools)

    workflow = make_workflow(cfg.workflow, tokenizer, choose_tools if tools_of else tools, cfg.agent, cfg.reward)
    if not cfg.heldout.dataset:
        return tools, workflow, None, []
    heldout_tools = tools
    if cfg.heldout.tools is not None:
        heldout_tools = await open_on_stack(cfg.heldout.tools.model_copy(update={"record": cfg.tools.record}))
    greedy = cfg.agent.model_copy(update={"temperature": 0.0})
    heldout_workflow = make_workflow(cfg.workflow, tokenizer, heldout_tools, greedy, cfg.reward)
    return tools, workflow, heldout_workflow, load_dataset(cfg.heldout.dataset)


async def _tools_per_corpus(
    cfg: TrainConfig, records: Sequence[dict[str, Any]], default_tools: Any,
    open_tools_for: Callable[[ToolsConfig], Awaitable[Mapping[str, Tool]]],
) -> dict[str, Any]:
    """corpus spec -> tools over it, for every corpus the records name (`corpus_from_data`)."""
    corpora = {r["metadata"].get("corpus") for r in records}
    if None in corpora or "" in corpora:
        missing = next(r for r in records if not r["metadata"].get("corpus"))
        raise ConfigError(
            f"{cfg.data}: record {missing['id']!r} names no corpus (metadata.corpus), which corpus_from_data needs; "
            "use a built-in world set or add the field"
        )
    out = {cfg.tools.corpus: default_tools} if cfg.tools.corpus else {}
    for corpus in sorted(corpora - set(out)):
        out[corpus] = await open_tools_for(cfg.tools.model_copy(update={"corpus": corpus, "index": None}))
    return out


def _heldout_eval(workflow: RolloutWorkflow, engine: Engine, records: Sequence[Any], cfg: TrainConfig):
    """The loop's held-out evaluation: the mean answer metric of greedy episodes (the eval runner's)."""
    from asearch.eval.runner import evaluate_workflow

    async def heldout_accuracy() -> float:
        return (await evaluate_workflow(workflow, engine, records, concurrency=cfg.heldout.concurrency)).mean_score

    return heldout_accuracy


async def _start_trainer(cfg: TrainConfig, launcher: Launcher | None, model: Any) -> tuple[Trainer, int]:
    """(the trainer, its parameter count): the launcher's (e.g. FSDP ranks on a cluster), else this process's."""
    if launcher is not None:
        placed = await asyncio.to_thread(
            launcher.trainer, cfg.trainer, temperature=cfg.agent.temperature, total_steps=cfg.steps
        )
        if placed is not None:
            return placed, int(getattr(placed, "parameters", 0))
    from asearch.models.device import resolve_device
    from asearch.models.loading import load_model

    device = resolve_device(cfg.trainer.device)
    policy = (model if model is not None else load_model(cfg.model)).to(device)  # type: ignore[arg-type]  # transformers types its wrapped `to` as taking the model
    trainer = PolicyTrainer(policy, cfg.trainer, temperature=cfg.agent.temperature, total_steps=cfg.steps)
    return trainer, sum(p.numel() for p in policy.parameters())


@contextlib.asynccontextmanager
async def rollout_engine(
    cfg: TrainConfig, run: Path, trainer: Trainer, tokenizer: Any, version: int, log: Log = print,
    launcher: Launcher | None = None,
) -> AsyncIterator[tuple[Engine, WeightSync]]:  # fmt: skip
    """The engine the agents sample from, holding the trainer's weights as `version`, and how later
    versions reach it: in-process (the default), or a pool over rollout servers, given by URL or started
    by `launcher` (the caller stops it). Servers start from `model`, so they get the trainer's weights
    (after a resume: the checkpoint's) before the first request."""
    servers = cfg.servers
    if servers is None:
        assert isinstance(trainer, PolicyTrainer), "the in-process engine shares this process's policy"
        local = InProcessEngine(trainer.model, tokenizer, cfg=cfg.engine.options, version=version)
        try:
            yield local, LiveWeights(local, trainer)
        finally:
            await local.close()
        return
    if launcher is not None:
        await asyncio.to_thread(launcher.start)
    urls, sups = (launcher.urls, launcher.supervisors) if launcher else (servers.urls, [])
    engine = open_pool(servers, urls, supervisors=sups, version=version)
    weights: DiskWeights | CollectiveWeights
    weights = disk = DiskWeights(engine, trainer, tokenizer, run / "weights", servers.keep_weights, servers.weights_disk_dtype)
    if servers.weights == "collective" and engine.supports_weight_group() and hasattr(trainer, "broadcast_weights_or_leave"):
        tp = server_tensor_parallel(servers)
        weights = CollectiveWeights(
            engine, trainer, disk, list(urls), servers.weights_bucket_mb, servers.weights_dtype, servers.weights_timeout_s, tp,
            None if servers.weights_backend == "auto" else servers.weights_backend,
        )  # fmt: skip
    how = "a weight group (collective)" if isinstance(weights, CollectiveWeights) else "disk"
    log(f"generation: {len(urls)} {servers.kind} rollout server(s) ({', '.join(urls)}), weights via {how}")
    try:
        await weights.push(version)
        yield engine, weights
    finally:
        if isinstance(weights, CollectiveWeights):
            with contextlib.suppress(Exception):  # servers already gone: nothing to leave
                await weights.close()
        await engine.close()
        if launcher is not None:
            launcher.write_manifest()
