"""One RL training run: setup -> the asynchronous loop -> summary, resumable from its checkpoints.

The loop, per step: wait for B fresh groups (generation keeps going meanwhile) -> advantages ->
policy update (in a worker thread: the event loop keeps driving episodes, and a held-out evaluation
of the current weights if one is running) -> push weights to the engine once that evaluation is done
(in-flight requests resume under them) -> bump the version -> log, checkpoint, start an evaluation.

The engine is in-process by default; with `rollout_servers` it is a pool of rollout servers (given by
URL, or started by `launcher=local` / `launcher=ray`) that load each version from RUN/weights/vN. With
`launcher=ray` the trainer is `allocation.trainer_ranks` FSDP ranks on the cluster, not this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import random
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field, model_validator

from asearch.agent.loop import AgentConfig, run_episode
from asearch.agent.runtime import ToolsConfig, build_tools
from asearch.config import Config
from asearch.engine.inprocess import InProcessEngine, InProcessEngineConfig
from asearch.engine.pool import EnginePool, RolloutServersConfig, open_pool
from asearch.engine.types import Engine
from asearch.errors import ConfigError
from asearch.files import atomic_write_json
from asearch.launch.local import LocalLauncher
from asearch.launch.ray import RayLauncher
from asearch.launch.spec import Allocation, Launcher
from asearch.metrics.reward import RewardConfig, compute_reward
from asearch.rl.controller import ControllerConfig, Group, RolloutController
from asearch.rl.trainer import PolicyTrainer, Trainer, TrainerConfig, groups_to_samples
from asearch.runs import RunDir
from asearch.web.runtime import web_metrics


class HeldoutConfig(Config):
    """Periodic evaluation on held-out questions (greedy), for the accuracy-vs-wall-time curve."""

    dataset: str | None = Field(None, description="QA set spec or file (e.g. world:seed=200,n=100).")
    tools: ToolsConfig | None = Field(None, description="Tools for the held-out corpus (default: training tools).")
    every_s: float | None = Field(60.0, gt=0, description="Evaluate when this much wall time has passed.")
    every_steps: int | None = Field(None, ge=1)
    concurrency: int = Field(64, ge=1)


class TrainConfig(Config):
    seed: int = 0
    out: Path | None = Field(None, description="Run directory (default runs/train-<time>).")
    model: str = Field(description="Initial policy: HF directory, name or alias.")
    threads: int = Field(1, ge=1, description="torch intra-op threads (trainer and engine each use this many).")
    engine: InProcessEngineConfig = Field(
        default_factory=InProcessEngineConfig,
        description="The in-process engine; with launcher=local also the servers' batch, length and dtype.",
    )
    rollout_servers: RolloutServersConfig | None = Field(
        None, description="Generate on rollout servers instead of in this process (None: in-process engine)."
    )
    launcher: Literal["none", "local", "ray"] = Field(
        "none",
        description="none: use the in-process engine or rollout_servers.urls; local: start "
        "allocation.rollout_servers servers on this machine (subprocesses) for this run; ray: start the "
        "servers and allocation.trainer_ranks FSDP trainer ranks as actors on a Ray cluster.",
    )
    allocation: Allocation = Field(default_factory=Allocation, description="What a launcher starts.")
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    corpus_from_data: bool = Field(
        False,
        description="Search each training question in the corpus its record names (`metadata.corpus`, which "
        "built-in world sets carry), with `tools`' other settings; one index per corpus, built at start. "
        "Trains on many worlds at once, so a policy cannot do well by remembering one world's facts.",
    )
    agent: AgentConfig = Field(default_factory=AgentConfig)
    data: str = Field(description="Training questions: a QA set spec or file.")
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: ControllerConfig = Field(default_factory=ControllerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    steps: int = Field(100, ge=1, description="RL steps (policy versions).")
    max_rl_seconds: float | None = Field(None, gt=0, description="Stop after this much RL wall time.")
    heldout: HeldoutConfig = Field(default_factory=HeldoutConfig)
    checkpoint_every: int = Field(10, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    log_trajectories_every: int = Field(5, ge=1, description="Every N steps, save one group's trajectories.")

    @model_validator(mode="after")
    def _check_servers(self) -> TrainConfig:
        urls = self.rollout_servers.urls if self.rollout_servers else []
        if self.launcher != "none" and urls:
            raise ValueError(f"launcher={self.launcher} starts its own servers: drop rollout_servers.urls ({urls})")
        if self.launcher != "ray" and self.allocation.trainer_ranks > 1:
            raise ValueError(
                f"allocation.trainer_ranks={self.allocation.trainer_ranks} needs launcher=ray (FSDP ranks as "
                f"Ray actors); launcher={self.launcher} trains in this process"
            )
        if self.corpus_from_data and (self.tools.server_url or self.tools.web or self.tools.index):
            raise ValueError("corpus_from_data builds a local index per corpus: drop tools.server_url, tools.web and tools.index")
        if self.launcher == "none" and self.rollout_servers is not None and not urls:
            raise ValueError("rollout_servers needs urls of running servers, or launcher=local to start them")
        return self

    @property
    def servers(self) -> RolloutServersConfig | None:
        """The rollout servers' settings, or None when generation runs in this process."""
        if self.launcher == "none":
            return self.rollout_servers
        return self.rollout_servers or RolloutServersConfig()


def cycle_data(records: Sequence[dict[str, Any]], seed: int, start: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """Endless (position, record) stream; epoch e is a seeded shuffle, so a position resumes exactly."""
    n, pos = len(records), start
    assert n > 0, "no training questions"
    while True:
        order = list(range(n))
        random.Random(seed * 100_003 + pos // n).shuffle(order)
        for i in range(pos % n, n):
            yield pos, records[order[i]]
            pos += 1


async def heldout_accuracy(engine, tokenizer, tools, records, agent_cfg: AgentConfig, reward_cfg, concurrency: int):
    """Greedy accuracy (mean metric score) on held-out questions; returns (accuracy, trajectories)."""
    greedy = agent_cfg.model_copy(update={"temperature": 0.0})
    sem = asyncio.Semaphore(concurrency)

    async def one(r):
        async with sem:
            t = await run_episode(engine, tokenizer, tools, r["question"], greedy, trajectory_id=f"eval-{r['id']}")
            return t, compute_reward(t, r["golds"], reward_cfg).score

    results = await asyncio.gather(*(one(r) for r in records))
    return sum(s for _, s in results) / max(len(results), 1), [t for t, _ in results]


def _tools_per_corpus(cfg: TrainConfig, records, default_tools, closers: list[Any]) -> dict[str, Any]:
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
        out[corpus], more = build_tools(cfg.tools.model_copy(update={"corpus": corpus, "index": None}), progress=False)
        closers.extend(more)
    return out


def _load_records(spec: str) -> list[dict[str, Any]]:
    from asearch.eval.datasets import load_dataset

    return [r.model_dump(mode="json") for r in load_dataset(spec)]


# ---------------------------------------------------------------------------- checkpoints


def latest_checkpoint(run: Path) -> Path | None:
    ckpts = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    ckpts = [p for p in ckpts if (p / "state.json").exists()]  # state.json is written last
    return ckpts[-1] if ckpts else None


def save_checkpoint(run: Path, step: int, trainer: Trainer, state: dict[str, Any], keep: int) -> Path:
    final = run / "checkpoints" / f"step_{step}"
    tmp = run / "checkpoints" / f".tmp_step_{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(trainer.state_dict(), tmp / "trainer.pt")
    atomic_write_json(tmp / "state.json", state)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    old = sorted((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-keep]
    for p in old:
        shutil.rmtree(p, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------- the rollout engine


@contextlib.asynccontextmanager
async def rollout_engine(
    cfg: TrainConfig, run: Path, trainer: Trainer, tokenizer: Any, version: int, log=print,
    launcher: Launcher | None = None,
) -> AsyncIterator[Engine]:
    """The engine the agents sample from, holding the trainer's weights as `version`: in-process (the
    default), or a pool over rollout servers, given by URL or started by `launcher` (see `make_launcher`)
    and stopped on the way out, error or Ctrl-C included. Servers start from `model`, so they get the
    trainer's weights (after a resume: the checkpoint's) before the first request."""
    servers = cfg.servers
    if servers is None:
        assert isinstance(trainer, PolicyTrainer), "the in-process engine shares this process's policy"
        engine = InProcessEngine(trainer.model, tokenizer, cfg=cfg.engine, version=version)
        try:
            yield engine
        finally:
            await engine.close()
        return
    try:
        if launcher is not None:
            await asyncio.to_thread(launcher.start)
        urls, sups = (launcher.urls, launcher.supervisors) if launcher else (servers.urls, [])
        engine = open_pool(servers, urls, supervisors=sups, version=version)
        log(f"generation: {len(urls)} {servers.kind} rollout server(s) ({', '.join(urls)}), weights via disk")
        try:
            await push_weights(engine, trainer, tokenizer, version, run, servers)
            yield engine
        finally:
            await engine.close()
            if launcher is not None:
                launcher.write_manifest()
    finally:
        if launcher is not None:
            launcher.stop()


def make_launcher(cfg: TrainConfig, run: Path, log=print) -> Launcher | None:
    """The launcher `cfg.launcher` names (not started), or None: local subprocesses or Ray actors."""
    if cfg.launcher == "none":
        return None
    launcher_cls = LocalLauncher if cfg.launcher == "local" else RayLauncher
    return launcher_cls(
        cfg.model, cfg.allocation, cfg.servers, engine=cfg.engine, log_dir=run / "logs", seed=cfg.seed,
        trainer_threads=cfg.threads, log=log,
    )  # fmt: skip


async def push_weights(
    engine: Engine, trainer: Trainer, tokenizer: Any, version: int, run: Path,
    servers: RolloutServersConfig | None,
) -> None:  # fmt: skip
    """Make `version` the engine's weights. In-process: the live state dict. Rollout servers: the policy is
    saved as RUN/weights/v{version} (atomically; the latest `keep_weights` stay) and every server loads it."""
    if servers is None:
        assert isinstance(trainer, PolicyTrainer), "the in-process engine shares this process's policy"
        await engine.update_weights(trainer.model.state_dict(), version)
        return
    path = await asyncio.to_thread(trainer.save_hf, run / "weights" / f"v{version}", tokenizer)
    await engine.update_weights(path, version)
    saved = {int(p.name[1:]): p for p in (run / "weights").glob("v[0-9]*")}
    older = sorted(v for v in saved if v < version)
    newer = [v for v in saved if v > version]  # written before a kill, by steps that resume redoes
    for v in older[: max(len(older) - (servers.keep_weights - 1), 0)] + newer:
        shutil.rmtree(saved[v], ignore_errors=True)


# ---------------------------------------------------------------------------- the run


async def train(cfg: TrainConfig, *, run: RunDir, log=print, model=None, tokenizer=None) -> dict[str, Any]:
    """Run (or resume) RL training into `run`. Returns the summary dict (also written to summary.json)."""
    from asearch.models.loading import load_model, load_tokenizer

    # ---- setup
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    run.save_config(cfg)
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(cfg.model)
    records = _load_records(cfg.data)
    tools, closers = build_tools(cfg.tools, progress=False)
    tools_of = _tools_per_corpus(cfg, records, tools, closers) if cfg.corpus_from_data else {}
    heldout = _load_records(cfg.heldout.dataset) if cfg.heldout.dataset else []
    heldout_tools = build_tools(cfg.heldout.tools, progress=False)[0] if cfg.heldout.tools else tools

    start_step, rl_wall_before, parts = 0, 0.0, {}
    engines = contextlib.AsyncExitStack()  # closed (servers stopped) in the `finally` of the loop
    launcher = make_launcher(cfg, run.path, log)
    try:  # until the loop's `finally` owns them, a failure here must stop what the launcher placed
        if isinstance(launcher, RayLauncher):  # the policy lives in the FSDP ranks on the cluster
            await asyncio.to_thread(launcher.connect)
            trainer = await asyncio.to_thread(
                launcher.trainer, cfg.trainer, temperature=cfg.agent.temperature, total_steps=cfg.steps
            )
            n_params = trainer.parameters
        else:
            policy = model if model is not None else load_model(cfg.model)
            trainer = PolicyTrainer(policy, cfg.trainer, temperature=cfg.agent.temperature, total_steps=cfg.steps)
            n_params = sum(p.numel() for p in policy.parameters())
        ckpt = latest_checkpoint(run.path)
        if ckpt is not None:
            trainer.load_state_dict(torch.load(ckpt / "trainer.pt", weights_only=False))
            state = json.loads((ckpt / "state.json").read_text())
            start_step, rl_wall_before = state["step"], state["rl_wall_s"]
            parts = RolloutController.restore_parts(state["controller"])
            if dropped := run.rewind(start_step):
                log(f"dropped {dropped} metrics/trajectory rows logged after step {start_step} (they are redone)")
            log(f"resumed from {ckpt} (step {start_step}, {len(parts['ready'])} queued groups, {len(parts['redo'])} to redo)")
        version = start_step
        engine = await engines.enter_async_context(
            rollout_engine(cfg, run.path, trainer, tokenizer, version, log, launcher)
        )
    except BaseException:
        if launcher is not None:
            await asyncio.to_thread(launcher.stop)
        raise

    async def episode(sample: dict[str, Any], k: int):
        return await run_episode(
            engine, tokenizer, tools_of.get(sample["metadata"].get("corpus"), tools), sample["question"], cfg.agent,
            trajectory_id=f"{sample['id']}-{k}-{random.getrandbits(32):08x}",
            metadata={"id": sample["id"]},
        )  # fmt: skip

    def reward(traj, sample) -> float:
        res = compute_reward(traj, sample["golds"], cfg.reward, sample.get("aug_golds", ()))
        traj.reward = res.reward
        traj.metadata["score"] = res.score
        return res.reward

    data = cycle_data(records, cfg.seed, parts.get("data_position", 0))
    controller = RolloutController(cfg.rollout, data, episode, reward, **parts)
    B, n, eta = cfg.rollout.batch_size, cfg.rollout.group_size, cfg.rollout.max_staleness
    log(
        f"RL: {len(records)} questions, B={B} groups x n={n} samples = {B * n} trajectories/step, eta={eta} "
        f"({'synchronous' if eta == 0 else 'one-step-off' if eta == 1 else 'fully asynchronous'}), "
        f"<= {cfg.rollout.max_concurrent} groups in flight, {n_params:,} params"
    )

    # ---- the loop
    t_start = time.perf_counter()
    last_eval_t, step = -1e9, start_step
    summary: dict[str, Any] = {}
    controller.start()

    def rl_wall() -> float:
        return rl_wall_before + time.perf_counter() - t_start

    async def evaluate_heldout(at_version: int) -> None:
        """Greedy accuracy of policy `at_version`, logged as its own row. It runs beside the next train step
        (the engine keeps this version until it is done: the next weight push waits for it)."""
        t_eval, wall = time.perf_counter(), rl_wall()
        acc, _ = await heldout_accuracy(
            engine, tokenizer, heldout_tools, heldout, cfg.agent, cfg.reward, cfg.heldout.concurrency
        )
        run.log(at_version, {"eval/heldout_acc": acc, "eval/seconds": time.perf_counter() - t_eval, "perf/rl_wall_s": wall})
        if at_version == 0:
            summary["heldout_acc_start"] = acc
        log(f"held-out accuracy {acc:.3f} at version {at_version} ({time.perf_counter() - t_eval:.1f}s)")

    def checkpoint_state() -> dict[str, Any]:
        return {"step": step, "rl_wall_s": rl_wall(), "controller": controller.state_dict()}

    pending_eval: asyncio.Task | None = None
    saved_step = start_step
    try:
        if heldout and start_step == 0:
            pending_eval = asyncio.create_task(evaluate_heldout(version))
            last_eval_t = time.perf_counter()
        while step < cfg.steps and (cfg.max_rl_seconds is None or rl_wall() < cfg.max_rl_seconds):
            t0 = time.perf_counter()
            try:  # the time budget holds while waiting too (e.g. when every group is rejected)
                left = None if cfg.max_rl_seconds is None else max(cfg.max_rl_seconds - rl_wall(), 0.0)
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when a cancel
                # (Ctrl-C) lands just as the batch completes, and the run would train on.
                async with asyncio.timeout(left):
                    batch = await controller.get_batch()
            except TimeoutError:
                log(f"RL time budget ({cfg.max_rl_seconds:.0f}s) spent waiting for a batch; rejected so far: "
                    f"{dict(controller.rejected)}")  # fmt: skip
                break
            if batch is None:
                log("training data exhausted")
                break
            t1 = time.perf_counter()
            samples, _ = groups_to_samples([g.rewards for g in batch], [g.trajectories for g in batch], cfg.trainer.advantages)
            progress = step / cfg.steps if cfg.max_rl_seconds is None else max(step / cfg.steps, rl_wall() / cfg.max_rl_seconds)
            stats = await asyncio.to_thread(trainer.train_step, samples, policy_version=version, progress=progress)
            t2 = time.perf_counter()
            if pending_eval is not None:  # it measures the engine's current weights: push after it
                await pending_eval
                pending_eval = None
            t_eval_wait = time.perf_counter() - t2
            version += 1
            await push_weights(engine, trainer, tokenizer, version, run.path, cfg.servers)
            controller.set_version(version)
            t3 = time.perf_counter()
            step += 1

            # web tools: cache hit rate and costs so far, and this step's spending (then restarted at 0)
            metrics = {**stats, **_rollout_metrics(batch, version - 1, controller), **web_metrics(tools, end_step=True)}
            metrics.update({
                "perf/rollout_wait_s": t1 - t0, "perf/train_s": t2 - t1, "perf/eval_wait_s": t_eval_wait,
                "perf/weight_sync_s": t3 - t2 - t_eval_wait, "perf/step_s": t3 - t0, "perf/rl_wall_s": rl_wall(),
                "perf/generator_idle_frac": controller.idle_fraction(),
                "perf/trajectories_per_s": B * n / max(t3 - t0, 1e-9),
            })  # fmt: skip
            run.log(step, metrics)
            log(
                f"step {step:4d}  reward {metrics['rollout/reward_mean']:+.3f}  acc {metrics['rollout/accuracy']:.3f}"
                f"  turns {metrics['rollout/turns_mean']:.1f}  stale<= {metrics['rollout/staleness_max']:.0f}"
                f"  {metrics['perf/step_s']:.1f}s/step  idle {metrics['perf/generator_idle_frac']:.2f}"
            )
            if step % cfg.log_trajectories_every == 0:
                for t in batch[0].trajectories:
                    run.log_trajectory({"step": step, "group": batch[0].index, **t.to_dict()})
            out_of_time = cfg.max_rl_seconds is not None and rl_wall() >= cfg.max_rl_seconds
            if step % cfg.checkpoint_every == 0 or step == cfg.steps or out_of_time:  # the last step is kept
                save_checkpoint(run.path, step, trainer, checkpoint_state(), cfg.keep_checkpoints)
                saved_step = step
            due = (cfg.heldout.every_s and time.perf_counter() - last_eval_t >= cfg.heldout.every_s) or (
                cfg.heldout.every_steps and step % cfg.heldout.every_steps == 0
            )
            if heldout and (due or step == cfg.steps):
                pending_eval = asyncio.create_task(evaluate_heldout(version))
                last_eval_t = time.perf_counter()
        if step > saved_step:  # the budget ran out while waiting for a batch: keep the last step too
            save_checkpoint(run.path, step, trainer, checkpoint_state(), cfg.keep_checkpoints)
        if pending_eval is not None:  # the last version's: nothing waits on it any more
            await pending_eval
            pending_eval = None
    finally:
        if pending_eval is not None:
            pending_eval.cancel()
            await asyncio.gather(pending_eval, return_exceptions=True)
        await controller.close()
        if isinstance(engine, EnginePool):
            summary["rollout_servers"] = engine.stats()
        await engines.aclose()
        for c in closers:
            if inspect.isawaitable(res := c()):  # web and server clients close asynchronously
                await res

    rows = run.metrics()
    evals = [r["eval/heldout_acc"] for r in rows if r.get("eval/heldout_acc") is not None]
    summary.update({
        "steps": step, "policy_version": version, "rl_wall_seconds": rl_wall(),
        "heldout_acc_final": evals[-1] if evals else None,
        "rejected_groups": dict(controller.rejected), "episode_errors": controller.errors[:20],
    })  # fmt: skip
    run.write_summary({**_existing_summary(run.path), **summary})
    return summary


def _existing_summary(path: Path) -> dict[str, Any]:
    p = path / "summary.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _rollout_metrics(batch: list[Group], policy_version: int, controller: RolloutController) -> dict[str, float]:
    trajs = [t for g in batch for t in g.trajectories]
    k = max(len(trajs), 1)
    staleness = Counter(max(0, policy_version - t.min_version) for t in trajs if t.min_version >= 0)
    m = {
        "rollout/reward_mean": sum(t.reward or 0.0 for t in trajs) / k,
        "rollout/accuracy": sum(t.metadata.get("score", 0.0) for t in trajs) / k,
        "rollout/turns_mean": sum(t.num_turns for t in trajs) / k,
        "rollout/searches_mean": sum(t.counters.get("searches", 0) for t in trajs) / k,
        "rollout/gen_tokens_mean": sum(t.generated_tokens for t in trajs) / k,
        "rollout/parse_errors": float(sum(t.counters.get("parse_errors", 0) for t in trajs)),
        "rollout/tool_errors": float(sum(t.counters.get("tool_errors", 0) for t in trajs)),
        "rollout/no_answer_rate": sum(t.answer is None for t in trajs) / k,
        "rollout/staleness_max": float(max(staleness, default=0)),
        "rollout/staleness_mean": sum(s * c for s, c in staleness.items()) / max(sum(staleness.values()), 1),
    }
    for s, c in staleness.items():
        m[f"rollout/staleness_hist/{s}"] = float(c)
    for cause, c in controller.rejected.items():
        m[f"rollout/rejected/{cause}"] = float(c)
    return m
