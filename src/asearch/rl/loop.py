"""The asynchronous RL loop over an engine, a trainer and a rollout workflow it is handed.

One step, as named phases:

    wait_for_batch -> advantages -> train_step -> sync_weights -> log_step -> checkpoint -> evaluate

Generation never stops: the controller keeps episodes running on the engine under the staleness rule
while a batch trains (in a worker thread, so the event loop keeps driving episodes, and a held-out
evaluation of the current weights if one is running). `sync_weights` waits for that evaluation, then
pushes the new version to the engine and lets the controller admit groups under it. What the loop runs
on is built elsewhere (`asearch.launch.train`): this module imports no launcher and no tool.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import Field

from asearch.agent.workflow import RolloutWorkflow
from asearch.config import Config
from asearch.engine.types import Engine
from asearch.rl.checkpoint import Resume, save_checkpoint
from asearch.rl.controller import ControllerConfig, EpisodeFn, Group, RolloutController
from asearch.rl.trainer import Sample, Trainer, TrainerConfig, groups_to_samples
from asearch.rl.weights import WeightSync
from asearch.runs import RunDir
from asearch.tools.registry import tool_counters

Log = Callable[[str], Any]


class EvalSchedule(Config):
    """When the held-out evaluation runs (greedy, for the accuracy-vs-wall-time curve): at the start,
    whenever `every_s` seconds or `every_steps` steps have passed, and after the last step."""

    every_s: float | None = Field(60.0, gt=0, description="Evaluate when this much wall time has passed.")
    every_steps: int | None = Field(None, ge=1, description="Evaluate every this many steps (as well).")


class LoopConfig(Config):
    """The RL loop's own settings; `asearch.launch.train.TrainConfig` adds what the loop runs on."""

    seed: int = Field(0, description="Seeds the data order, torch and the engine's sampling streams.")
    rollout: ControllerConfig = Field(default_factory=ControllerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    steps: int = Field(100, ge=1, description="RL steps (policy versions).")
    max_rl_seconds: float | None = Field(None, gt=0, description="Stop after this much RL wall time.")
    heldout: EvalSchedule = Field(default_factory=EvalSchedule)
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints (the last step is always kept).")
    keep_checkpoints: int = Field(2, ge=1, description="Checkpoints kept on disk (the newest).")
    log_trajectories_every: int = Field(5, ge=1, description="Every N steps, save one group's trajectories.")


def cycle_data(records: Sequence[Any], seed: int, start: int = 0) -> Iterator[tuple[int, Any]]:
    """Endless (position, record) stream; epoch e is a seeded shuffle, so a position resumes exactly."""
    n, pos = len(records), start
    assert n > 0, "no training questions"
    while True:
        order = list(range(n))
        random.Random(seed * 100_003 + pos // n).shuffle(order)
        for i in range(pos % n, n):
            yield pos, records[order[i]]
            pos += 1


def episode_seed(seed: int, start_step: int, n: int) -> int:
    """The sampling seed of the n-th episode (0-based) a process resumed at `start_step` starts in a run
    seeded `seed`: 63 bits of a hash, so two episodes' per-turn seeds (`asearch.agent.loop.turn_seed`) do not meet."""
    digest = hashlib.blake2b(f"{seed}/{start_step}/{n}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


HeldoutEval = Callable[[], Awaitable[float]]  # greedy accuracy of the engine's current weights


class TrainingLoop:
    """Run (or resume, from `resume`) the loop into `run`; `await loop.run()` returns the summary."""

    def __init__(
        self,
        cfg: LoopConfig,
        *,
        run: RunDir,
        engine: Engine,
        trainer: Trainer,
        workflow: RolloutWorkflow,
        records: Sequence[Any],
        weights: WeightSync,
        resume: Resume | None = None,
        heldout: HeldoutEval | None = None,
        step_metrics: Callable[[], Mapping[str, float]] = dict,
        log: Log = print,
    ):
        resume = resume or Resume()
        self.cfg, self.run_dir, self.trainer, self.workflow = cfg, run, trainer, workflow
        self.weights, self.heldout, self.step_metrics, self.log = weights, heldout, step_metrics, log
        self.step = self.version = self.saved_step = resume.step
        self.rl_wall_before = resume.rl_wall_s
        data = cycle_data(records, cfg.seed, resume.controller.get("data_position", 0))
        episode = self._seeded_episodes(engine, workflow, start_step=resume.step)
        self.controller = RolloutController(cfg.rollout, data, episode, seed=cfg.seed, **resume.controller)
        self.pending_eval: asyncio.Task | None = None
        self.summary: dict[str, Any] = {}
        self.t_start = self.last_eval_t = 0.0

    def _seeded_episodes(self, engine: Engine, workflow: RolloutWorkflow, *, start_step: int) -> EpisodeFn:
        """The controller's episode function: the workflow on a prompt, with the seed `episode_seed` gives the
        n-th episode this process starts. The controller starts episodes in admission order, so n, and with it
        every sampled token, follows from the data stream and not from when each request reaches the engine
        (tool latencies reorder those)."""
        numbers = itertools.count()
        return lambda sample, k: workflow.arun_episode(
            engine, sample, seed=episode_seed(self.cfg.seed, start_step, next(numbers))
        )

    def rl_wall(self) -> float:
        return self.rl_wall_before + time.perf_counter() - self.t_start

    def out_of_time(self) -> bool:
        return self.cfg.max_rl_seconds is not None and self.rl_wall() >= self.cfg.max_rl_seconds

    # ---------------------------------------------------------------- the loop

    async def run(self) -> dict[str, Any]:
        self.t_start = time.perf_counter()
        self.controller.start()
        try:
            if self.step == 0:
                self.evaluate(force=True)
            while self.step < self.cfg.steps and not self.out_of_time():
                t0 = time.perf_counter()
                batch = await self.wait_for_batch()
                if batch is None:
                    break
                t1 = time.perf_counter()
                samples = self.advantages(batch)
                stats = await self.train_step(samples)
                t2 = time.perf_counter()
                eval_wait_s = await self.sync_weights()
                t3 = time.perf_counter()
                perf = {"perf/rollout_wait_s": t1 - t0, "perf/train_s": t2 - t1, "perf/eval_wait_s": eval_wait_s,
                        "perf/weight_sync_s": t3 - t2 - eval_wait_s, "perf/step_s": t3 - t0}  # fmt: skip
                self.log_step(batch, stats, perf)
                await self.checkpoint()
                self.evaluate()
            await self.finish()
        finally:
            await self.close()
        return self.summarize()

    # ---------------------------------------------------------------- the phases

    async def wait_for_batch(self) -> list[Group] | None:
        """The next B groups, or None when the data ran out or the time budget was spent waiting."""
        budget = self.cfg.max_rl_seconds
        try:  # the time budget holds while waiting too (e.g. when every group is rejected)
            # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result when a cancel
            # (Ctrl-C) lands just as the batch completes, and the run would train on.
            async with asyncio.timeout(None if budget is None else max(budget - self.rl_wall(), 0.0)):
                batch = await self.controller.get_batch()
        except TimeoutError:
            self.log(f"RL time budget ({budget:.0f}s) spent waiting for a batch; rejected so far: "
                     f"{dict(self.controller.rejected)}")  # fmt: skip
            return None
        if batch is None:
            self.log("training data exhausted")
        return batch

    def advantages(self, batch: list[Group]) -> list[Sample]:
        """Per-token training samples, each carrying its group-relative advantage."""
        # group by group: a group that lost episodes to infrastructure faults is smaller than the others
        adv, first = self.cfg.trainer.advantages, 0
        samples: list[Sample] = []
        for g in batch:
            samples += groups_to_samples([g.rewards], [g.trajectories], adv, first_episode=first)[0]
            first += len(g.trajectories)
        return samples

    async def train_step(self, samples: list[Sample]) -> dict[str, float]:
        """One policy update, in a worker thread (generation and evaluation go on meanwhile)."""
        cfg = self.cfg
        progress = self.step / cfg.steps  # of the learning-rate schedule: steps, or the time budget if sooner
        if cfg.max_rl_seconds is not None:
            progress = max(progress, self.rl_wall() / cfg.max_rl_seconds)
        return await asyncio.to_thread(self.trainer.train_step, samples, policy_version=self.version, progress=progress)

    async def sync_weights(self) -> float:
        """Push version v+1 to the engine once the evaluation of v is done (it measures the engine's current
        weights); then the controller admits groups under it. Returns the time spent waiting for the eval."""
        t0 = time.perf_counter()
        if self.pending_eval is not None:
            await self.pending_eval
            self.pending_eval = None
        eval_wait_s = time.perf_counter() - t0
        self.version += 1
        await self.weights.push(self.version)
        self.controller.set_version(self.version)
        self.step += 1
        return eval_wait_s

    def log_step(self, batch: list[Group], stats: Mapping[str, float], perf: Mapping[str, float]) -> None:
        """One metrics row (trainer stats, rollout/, the step metrics, `perf` timings), a console line and, every
        `log_trajectories_every` steps, the first group's trajectories."""
        ctl, B, n = self.controller, self.cfg.rollout.batch_size, self.cfg.rollout.group_size
        metrics = {**stats, **rollout_metrics(batch, self.version - 1, ctl, self.workflow), **self.step_metrics()}
        metrics.update(perf)
        metrics.update({"perf/rl_wall_s": self.rl_wall(), "perf/generator_idle_frac": ctl.idle_fraction(),
                        "perf/trajectories_per_s": B * n / max(perf["perf/step_s"], 1e-9)})  # fmt: skip
        self.run_dir.log(self.step, metrics)
        self.log(
            f"step {self.step:4d}  reward {metrics['rollout/reward_mean']:+.3f}  acc {metrics['rollout/accuracy']:.3f}"
            f"  turns {metrics['rollout/turns_mean']:.1f}  stale<= {metrics['rollout/staleness_max']:.0f}"
            f"  {metrics['perf/step_s']:.1f}s/step  idle {metrics['perf/generator_idle_frac']:.2f}"
        )
        if self.step % self.cfg.log_trajectories_every == 0:
            for t in batch[0].trajectories:
                self.run_dir.log_trajectory({"step": self.step, "group": batch[0].index, **t.to_dict()})

    async def checkpoint(self, *, force: bool = False) -> None:
        """Every `checkpoint_every` steps, at the last step and when the time budget ends the run; written in a
        worker thread (each trainer rank its own shard), so generation goes on meanwhile."""
        due = self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps or self.out_of_time()
        if not (force or due):
            return
        state = {"step": self.step, "rl_wall_s": self.rl_wall(), "controller": self.controller.state_dict()}
        await asyncio.to_thread(save_checkpoint, self.run_dir.path, self.step, self.trainer, state, self.cfg.keep_checkpoints)
        self.saved_step = self.step

    def evaluate(self, *, force: bool = False) -> None:
        """Start a held-out evaluation of the current version when one is due; it runs beside the next
        train step (the engine keeps this version until it is done)."""
        every = self.cfg.heldout
        due = force or self.step == self.cfg.steps
        due = due or bool(every.every_s and time.perf_counter() - self.last_eval_t >= every.every_s)
        due = due or bool(every.every_steps and self.step % every.every_steps == 0)
        if self.heldout is None or not due:
            return
        self.pending_eval = asyncio.create_task(self._evaluate(self.version))
        self.last_eval_t = time.perf_counter()

    async def _evaluate(self, version: int) -> None:
        t0, wall = time.perf_counter(), self.rl_wall()
        assert self.heldout is not None
        accuracy = await self.heldout()
        seconds = time.perf_counter() - t0
        self.run_dir.log(version, {"eval/heldout_acc": accuracy, "eval/seconds": seconds, "perf/rl_wall_s": wall})
        self.log(f"held-out accuracy {accuracy:.3f} at version {version} ({seconds:.1f}s)")

    async def finish(self) -> None:
        """Keep the last step (the budget may have run out while waiting for a batch) and wait for the last
        evaluation (nothing trains beside it any more)."""
        if self.step > self.saved_step:
            await self.checkpoint(force=True)
        if self.pending_eval is not None:
            await self.pending_eval
            self.pending_eval = None

    async def close(self) -> None:
        if self.pending_eval is not None:
            self.pending_eval.cancel()
            await asyncio.gather(self.pending_eval, return_exceptions=True)
        await self.controller.close()

    def summarize(self) -> dict[str, Any]:
        """The run's totals; held-out accuracies come from metrics.jsonl, which holds the part before a resume."""
        evals = [(r["step"], r["eval/heldout_acc"]) for r in self.run_dir.metrics() if r.get("eval/heldout_acc") is not None]
        self.summary.update({
            "steps": self.step, "policy_version": self.version, "rl_wall_seconds": self.rl_wall(),
            "heldout_acc_start": next((acc for version, acc in evals if version == 0), None),
            "heldout_acc_final": evals[-1][1] if evals else None,
            "rejected_groups": dict(self.controller.rejected), "episode_errors": self.controller.errors[:20],
            "episodes_generated": self.controller.episodes_generated, "episodes_kept": self.controller.episodes_kept,
        })  # fmt: skip
        return self.summary


def write_summary(run: RunDir, summary: Mapping[str, Any]) -> None:
    """RUN/summary.json: `summary` over what an earlier part of the run (e.g. before a resume) wrote."""
    path: Path = run.path / "summary.json"
    earlier = json.loads(path.read_text()) if path.exists() else {}
    run.write_summary({**earlier, **summary})


def rollout_metrics(
    batch: list[Group], policy_version: int, controller: RolloutController, workflow: RolloutWorkflow
) -> dict[str, float]:
    """rollout/: reward, accuracy (the answer metric), turns, tool use, errors, staleness, rejections."""
    trajs = [t for g in batch for t in g.trajectories]
    k = max(len(trajs), 1)
    staleness = Counter(max(0, policy_version - t.min_version) for t in trajs if t.min_version >= 0)
    m = {
        "rollout/reward_mean": sum(t.reward or 0.0 for t in trajs) / k,
        "rollout/accuracy": sum(t.score or 0.0 for t in trajs) / k,
        "rollout/turns_mean": sum(t.num_turns for t in trajs) / k,
        **{f"rollout/tool_calls/{c}": sum(t.counters.get(c, 0) for t in trajs) / k for c in tool_counters()},
        "rollout/read_turns_mean": sum(t.counters.get("read_turns", 0) for t in trajs) / k,
        "rollout/compactions_mean": sum(t.counters.get("compactions", 0) for t in trajs) / k,
        "rollout/gen_tokens_mean": sum(t.generated_tokens for t in trajs) / k,
        "rollout/parse_errors": float(sum(t.counters.get("parse_errors", 0) for t in trajs)),
        "rollout/tool_errors": float(sum(t.counters.get("tool_errors", 0) for t in trajs)),
        "rollout/no_answer_rate": sum(t.answer is None for t in trajs) / k,
        "rollout/staleness_max": float(max(staleness, default=0)),
        "rollout/staleness_mean": sum(s * c for s, c in staleness.items()) / max(sum(staleness.values()), 1),
    }
    if any(t.style == "openai_agent" for t in trajs):  # an OpenAI-client agent's
        m["rollout/prompt_mismatches"] = float(sum(t.counters.get("prompt_mismatches", 0) for t in trajs))
        m["rollout/agent_errors"] = float(sum(t.counters.get("agent_errors", 0) for t in trajs))
    for s, c in staleness.items():
        m[f"rollout/staleness_hist/{s}"] = float(c)
    for cause, c in controller.rejected.items():
        m[f"rollout/rejected/{cause}"] = float(c)
    for cause, c in workflow.rejected.items():
        m[f"rollout/rejected_episodes/{cause}"] = float(c)
    m["rollout/masked_episodes"] = float(controller.masked_episodes)
    for kind, c in controller.masked_by_kind.items():
        m[f"rollout/masked_episodes/{kind}"] = float(c)
    if controller.sampler is not None:
        for cause, c in controller.sampler.skipped.items():
            m[f"rollout/skipped/{cause}"] = float(c)
        for cls, share in controller.sampler.class_variance().items():
            m[f"rollout/class_variance/{cls}"] = share
    kept, dropped = controller.staleness.accepted, controller.staleness.rejected
    m["rollout/groups_per_kept"] = (kept + dropped) / max(kept, 1)
    # generation spent, in episodes: a probe-settled group costs its probes, not a whole group
    m["rollout/episodes_per_kept"] = controller.episodes_generated / max(controller.episodes_kept, 1)
    m["rollout/episode_waste"] = 1.0 - controller.episodes_kept / max(controller.episodes_generated, 1)
    return m
