"""eta = 0 through the product's asynchronous `TrainingLoop` (the controller and its staleness rule, the trainer
in a worker thread, live weight pushes) trains the same weights, bit for bit, as a plain synchronous loop
written out here over the same parts: take B questions, run their groups, advantages, train_step, push the
weights, repeat. Real parts: a tiny Qwen2, the in-process engine, BM25 search over a generated world."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
import torch

from asearch.agent.workflow import SearchAgentWorkflow
from asearch.config import load_config
from asearch.engine.local.inprocess import InProcessEngine
from asearch.launch.train import TrainConfig, load_records
from asearch.models.loading import load_model, load_tokenizer
from asearch.rl.loop import TrainingLoop, cycle_data, episode_seed
from asearch.rl.trainer import PolicyTrainer, groups_to_samples
from asearch.rl.weights import LiveWeights
from asearch.runs import RunDir
from asearch.tools import build_tools

ROOT = Path(__file__).resolve().parents[2]
WORLD = "world:seed=1,entities=200"
STEPS, B, N = 3, 2, 3


def _config(model_dir: Path, *overrides: str) -> TrainConfig:
    """The demo's RL stage (configs/train-world-tiny.yaml) at eta = 0, sized to run in seconds."""
    return load_config(TrainConfig, ROOT / "configs" / "train-world-tiny.yaml", [
        f"model={model_dir}", f"data={WORLD},n=12", "seed=3", f"steps={STEPS}", "max_rl_seconds=null",
        "corpus_from_data=false", f"tools.corpus={WORLD}", "heldout.dataset=null", "checkpoint_every=100",
        f"rollout.batch_size={B}", f"rollout.group_size={N}", "rollout.max_staleness=0", "rollout.max_concurrent=8",
        "rollout.drop_zero_variance=false", "agent.max_turns=3", "agent.max_new_tokens=8", "agent.temperature=1.0",
        "engine.max_seq_len=512", "engine.max_batch=1", "agent.max_context_tokens=512", "trainer.optim.lr=3e-3", *overrides,
    ])  # fmt: skip


class ParityRewardWorkflow(SearchAgentWorkflow):
    """The search agent, rewarded by the share of even token ids it generated: a random policy earns every
    value between 0 and 1, so advantages are not 0 and every step moves the weights. Keeps what each
    episode sampled, by its seed."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampled: dict[int | None, list[int]] = {}
        self.logprobs: dict[int | None, list[float]] = {}

    async def arun_episode(self, engine, item, *, seed=None, **kwargs):
        traj = await super().arun_episode(engine, item, seed=seed, **kwargs)
        generated = [(i, lp) for s in traj.segments for i, lp, m in zip(s.token_ids, s.logprobs, s.loss_mask, strict=True) if m]
        self.sampled[seed] = [i for i, _ in generated]
        self.logprobs[seed] = [lp for _, lp in generated]
        return traj

    def score(self, traj, item):
        ids = [i for s in traj.segments for i, m in zip(s.token_ids, s.loss_mask, strict=True) if m]
        traj.reward = traj.score = sum(i % 2 == 0 for i in ids) / max(len(ids), 1)
        return traj


def _parts(cfg: TrainConfig, tokenizer):
    """What `asearch.launch.train` builds for an in-process run: trainer, engine over its policy, workflow."""
    torch.manual_seed(cfg.seed)
    trainer = PolicyTrainer(load_model(cfg.model), cfg.trainer, temperature=cfg.agent.temperature, total_steps=cfg.steps)
    engine = InProcessEngine(trainer.model, tokenizer, cfg=cfg.engine.options, version=0)
    tools, closers = build_tools(cfg.tools, progress=False)
    return trainer, engine, ParityRewardWorkflow(tokenizer, tools, cfg.agent, cfg.reward), closers


async def _asynchronous(cfg: TrainConfig, tokenizer, out: Path):
    """The product's loop at eta = 0, as `asearch train` runs it in process."""
    trainer, engine, workflow, closers = _parts(cfg, tokenizer)
    run = RunDir(out, tensorboard=False)
    try:
        loop = TrainingLoop(
            cfg, run=run, engine=engine, trainer=trainer, workflow=workflow, records=load_records(cfg.data),
            weights=LiveWeights(engine, trainer), log=lambda _: None,
        )  # fmt: skip
        await loop.run()
    finally:
        await engine.close()
        for close in closers:
            close()
    return trainer, workflow, [r for r in run.metrics() if "perf/step_s" in r]


async def _synchronous(cfg: TrainConfig, tokenizer):
    """The textbook loop: each step generates its B groups from the current weights, then trains on them."""
    trainer, engine, workflow, closers = _parts(cfg, tokenizer)
    data = cycle_data(load_records(cfg.data), cfg.seed)
    stats = []
    try:
        for step in range(cfg.steps):
            questions = [rec for _, rec in itertools.islice(data, B)]
            seeds = [[episode_seed(cfg.seed, 0, (step * B + b) * N + k) for k in range(N)] for b in range(B)]
            groups = await asyncio.gather(*(
                asyncio.gather(*(workflow.arun_episode(engine, rec, seed=seed) for seed in seeds[b]))
                for b, rec in enumerate(questions)
            ))  # fmt: skip
            samples, _ = groups_to_samples([[t.reward for t in g] for g in groups], groups, cfg.trainer.advantages)
            stats.append(trainer.train_step(samples, policy_version=step, progress=step / cfg.steps))
            await LiveWeights(engine, trainer).push(step + 1)
    finally:
        await engine.close()
        for close in closers:
            close()
    return trainer, workflow, stats


def test_eta_0_trains_the_same_weights_as_a_synchronous_loop(tiny_world_model_dir, tmp_path):
    """One request decoded at a time (engine.max_batch=1), so every log-prob is computed alone: bit for bit."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(tiny_world_model_dir)
    cfg = _config(tiny_world_model_dir, "engine.max_batch=1")
    async_trainer, async_flow, rows = asyncio.run(_asynchronous(cfg, tokenizer, tmp_path / "async"))
    sync_trainer, sync_flow, sync_stats = asyncio.run(_synchronous(cfg, tokenizer))

    assert len(rows) == STEPS and all(r["rollout/turns_mean"] > 0 for r in rows)
    assert async_flow.sampled == sync_flow.sampled and len(sync_flow.sampled) == STEPS * B * N
    for key in ("loss/policy", "loss/behav_weight_mean", "perf/grad_norm", "staleness/versions_behind_hist/0"):
        assert [r[key] for r in rows] == [s[key] for s in sync_stats], key
    start = load_model(tiny_world_model_dir)
    params = zip(async_trainer.model.named_parameters(), sync_trainer.model.parameters(), start.parameters(), strict=True)
    assert any(not torch.equal(a, p0) for (_, a), _, p0 in params)  # the policy did train...
    for (name, a), s in zip(async_trainer.model.named_parameters(), sync_trainer.model.parameters(), strict=True):
        assert torch.equal(a, s), f"{name} differs by up to {(a - s).abs().max().item():.3g}"  # ...identically


def test_with_batched_decoding_both_loops_sample_the_same_tokens(tiny_world_model_dir, tmp_path):
    """Decoding requests together changes the last bits of their log-probs with the batch's make-up (which
    requests share a step depends on timing), so weights agree only to float noise; but every episode's
    seed is fixed by its place in the data stream, so the tokens are the same."""
    torch.set_num_threads(1)
    tokenizer = load_tokenizer(tiny_world_model_dir)
    cfg = _config(tiny_world_model_dir)
    async_trainer, async_flow, rows = asyncio.run(_asynchronous(cfg, tokenizer, tmp_path / "async"))
    sync_trainer, sync_flow, sync_stats = asyncio.run(_synchronous(cfg, tokenizer))

    assert async_flow.sampled == sync_flow.sampled and len(sync_flow.sampled) == STEPS * B * N
    assert [r["loss/policy"] for r in rows] == pytest.approx([s["loss/policy"] for s in sync_stats], rel=1e-4)
    for a, s in zip(async_trainer.model.parameters(), sync_trainer.model.parameters(), strict=True):
        torch.testing.assert_close(a, s, atol=1e-4, rtol=0)
    logprob_gap = max(abs(x - y) for k in sync_flow.logprobs for x, y in zip(async_flow.logprobs[k], sync_flow.logprobs[k], strict=True))
    weight_gap = max((a - s).abs().max().item() for a, s in zip(async_trainer.model.parameters(), sync_trainer.model.parameters(), strict=True))
    print(f"\n[eta=0, batched decoding] behaviour log-probs differ by up to {logprob_gap:.2g}, weights after {STEPS} steps by up to {weight_gap:.2g}")
