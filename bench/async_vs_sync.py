"""Fully asynchronous vs synchronous RL throughput on a heavy-tailed multi-turn workload (issue 5 §6).

One process, one run: the real in-process engine, agent loop, rollout controller and policy trainer
train a tiny random Qwen2 for the same S steps of B groups x n samples on the same seeded questions,
once per setting (eta = 0 synchronous, 1 one-step-off, 2 and 4 fully asynchronous). Each question
needs k turns, k heavy-tailed (Pareto, 2..60: a 30x spread); every turn is a real LLM call of
`--new-tokens` sampled tokens followed by a "keep searching" observation, and an episode ends at its
question's k (`max_turns`): a random policy never answers, so k, not luck, sets the work.

    .venv/bin/python bench/async_vs_sync.py                 # full run (a few minutes on 2 cores)
    .venv/bin/python bench/async_vs_sync.py --quick         # tiny sizes, seconds (the smoke test)

Prints a table (wall, trajectories/s, generator idle fraction, staleness, rejections, time split), the
ratios against the synchronous run, and ends with `async/sync throughput ratio: X.XX`. The table also
goes to bench/results/async_vs_sync.md (full runs only).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from asearch.files import atomic_write_text

RESULTS = Path(__file__).parent / "results" / "async_vs_sync.md"

# The observation after every turn. A random policy never writes a well-formed action, so the agent
# loop's correction is what it sees; phrasing it as a search result keeps the context realistic.
KEEP_SEARCHING = "\n<information>\nkeep searching: no answer yet\n</information>\n"
SYSTEM_PROMPT = (
    "Answer the question. Search with <search>query</search> as often as you need; "
    "results appear in <information></information>. Give the answer in <answer></answer>."
)


# --------------------------------------------------------------------------- workload


def heavy_tailed_turns(n: int, *, low: int, high: int, alpha: float, seed: int) -> list[int]:
    """n turn counts from a Pareto(alpha) with scale `low`, cut at `high`: mostly `low`, a few near `high`."""
    rng = random.Random(seed)
    return [min(high, int(low / (1.0 - rng.random()) ** (1.0 / alpha))) for _ in range(n)]


def question_stream(turns: Sequence[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(position, question) pairs in a fixed order, the same for every setting."""
    for i, k in enumerate(turns):
        yield i, {"id": f"q{i}", "question": f"Which search result {i} tells the fact number {i}?", "turns": k}


def build_policy(seed: int, hidden: int, layers: int, max_positions: int):
    """A random tiny Qwen2 and a byte-level BPE tokenizer trained on the strings the episodes contain."""
    from asearch.models import build_tiny_model, train_bpe_tokenizer

    texts = [SYSTEM_PROMPT, KEEP_SEARCHING, "Question: Which search result tells the fact number?"] * 50
    tok = train_bpe_tokenizer(texts, vocab_size=384)
    heads = max(2, hidden // 32)
    return build_tiny_model(
        tok, hidden=hidden, layers=layers, heads=heads, max_positions=max_positions, seed=seed
    ), tok


# --------------------------------------------------------------------------- one setting


@dataclass
class SettingResult:
    name: str
    eta: int
    wall_s: float
    trained_trajectories: int
    idle_fraction: float
    rollout_wait_s: float
    train_s: float
    weight_sync_s: float
    staleness_mean: float
    staleness_max: int
    rejected: dict[str, int]
    trained_turns_mean: float
    trained_turns_max: int
    trained_gen_tokens: int
    engine_tokens: int
    engine_mean_batch: float
    recomputed_tokens: int
    groups_started: int
    train_tokens: int
    long_groups_trained: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def trajectories_per_s(self) -> float:
        return self.trained_trajectories / max(self.wall_s, 1e-9)

    @property
    def trained_tokens_per_s(self) -> float:
        return self.trained_gen_tokens / max(self.wall_s, 1e-9)


def setting_name(eta: int) -> str:
    return {0: "synchronous", 1: "one-step-off"}.get(eta, "fully async")


async def run_setting(eta: int, args: argparse.Namespace, turns: Sequence[int]) -> SettingResult:
    """Train `args.steps` steps with max_staleness = eta, from the same initial policy and questions."""
    from asearch.agent.loop import AgentConfig, run_episode
    from asearch.engine.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.rl.controller import ControllerConfig, RolloutController
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig, groups_to_samples

    torch.manual_seed(args.seed)
    policy, tok = build_policy(args.seed, args.hidden, args.layers, args.max_positions)
    B, n, C = args.batch, args.group, args.max_concurrent or 4 * args.batch
    trainer = PolicyTrainer(
        policy, TrainerConfig(seed=args.seed, prox=args.prox), temperature=1.0, total_steps=args.steps
    )
    engine = InProcessEngine(
        policy,
        tok,
        cfg=InProcessEngineConfig(threads=1, max_batch=C * n, max_seq_len=args.max_positions, seed=args.seed),
    )
    base_agent = AgentConfig(
        style="search-r1",
        style_options={"system_prompt": SYSTEM_PROMPT, "correction_template": KEEP_SEARCHING},
        max_new_tokens=args.new_tokens,
        max_context_tokens=args.max_positions,
        temperature=1.0,
    )
    agents = {k: base_agent.model_copy(update={"max_turns": k}) for k in set(turns)}

    async def episode(sample: dict[str, Any], k: int):
        return await run_episode(
            engine,
            tok,
            {},
            sample["question"],
            agents[sample["turns"]],
            trajectory_id=f"{sample['id']}-{k}",
            seed=args.seed * 7919 + int(sample["id"][1:]) * 31 + k,
            metadata={"k": k},
        )

    def reward(traj, sample) -> float:
        # Throughput does not depend on what is rewarded; alternating 0/1 within a group gives every
        # group a nonzero advantage (none dropped as zero-variance), identically in every setting.
        return float(traj.metadata["k"] % 2)

    controller = RolloutController(
        ControllerConfig(batch_size=B, group_size=n, max_staleness=eta, max_concurrent=C),
        question_stream(turns),
        episode,
        reward,
    )
    wait_s = train_s = sync_s = 0.0
    staleness: list[int] = []
    trained_turns: list[int] = []
    trained_tokens = trained = train_tokens = long_trained = 0
    version = 0
    t_start = time.perf_counter()
    controller.start()
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = await controller.get_batch()
            if batch is None:
                raise RuntimeError(f"eta={eta}: ran out of questions; raise --questions")
            t1 = time.perf_counter()
            samples, _ = groups_to_samples(
                [g.rewards for g in batch], [g.trajectories for g in batch], trainer.cfg.advantages
            )
            stats = await asyncio.to_thread(trainer.train_step, samples, policy_version=version)
            t2 = time.perf_counter()
            train_tokens += int(stats["perf/train_tokens"])
            if args.verbose:
                print(f"    step {version}: wait {t1 - t0:.2f}s train {t2 - t1:.2f}s ({int(stats['perf/train_tokens'])} tok)")
            for g in batch:
                long_trained += g.sample["turns"] >= args.long_turns
                for t in g.trajectories:
                    staleness.append(max(0, version - t.min_version))
                    trained_turns.append(t.num_turns)
                    trained_tokens += t.generated_tokens
                    trained += 1
            version += 1
            await engine.update_weights(policy.state_dict(), version)
            controller.set_version(version)
            t3 = time.perf_counter()
            wait_s, train_s, sync_s = wait_s + t1 - t0, train_s + t2 - t1, sync_s + t3 - t2
        wall = time.perf_counter() - t_start
        idle = controller.idle_fraction()
        engine_stats = engine.stats()
        started = controller._seq
        rejected = dict(controller.rejected)  # before close(): its cancellations are not rejections
    finally:
        await controller.close()
        await engine.close()
    return SettingResult(
        name=setting_name(eta),
        eta=eta,
        wall_s=wall,
        trained_trajectories=trained,
        idle_fraction=idle,
        rollout_wait_s=wait_s,
        train_s=train_s,
        weight_sync_s=sync_s,
        staleness_mean=sum(staleness) / max(len(staleness), 1),
        staleness_max=max(staleness, default=0),
        rejected=rejected,
        trained_turns_mean=sum(trained_turns) / max(len(trained_turns), 1),
        trained_turns_max=max(trained_turns, default=0),
        trained_gen_tokens=trained_tokens,
        engine_tokens=int(engine_stats["tokens_generated"]),
        engine_mean_batch=float(engine_stats["mean_batch_size"]),
        recomputed_tokens=int(engine_stats["recomputed_tokens"]),
        groups_started=started,
        train_tokens=train_tokens,
        long_groups_trained=long_trained,
    )


# --------------------------------------------------------------------------- report


def format_report(results: Sequence[SettingResult], header: str) -> str:
    sync = next(r for r in results if r.eta == 0)
    lines = [
        header,
        "",
        "| setting | eta | wall s | traj/s | trained gen tok/s | generator idle | rollout wait s | train s "
        "| weight sync s | staleness mean/max | rejected | trained turns mean/max | engine rows/step "
        "| tokens generated (trained) | recomputed tok |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rej = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected.items())) or "0"
        lines.append(
            f"| {r.name} | {r.eta} | {r.wall_s:.1f} | {r.trajectories_per_s:.2f} | {r.trained_tokens_per_s:,.0f} "
            f"| {r.idle_fraction:.2f} | {r.rollout_wait_s:.1f} | {r.train_s:.1f} | {r.weight_sync_s:.2f} "
            f"| {r.staleness_mean:.2f}/{r.staleness_max} | {rej} | {r.trained_turns_mean:.1f}/{r.trained_turns_max} "
            f"| {r.engine_mean_batch:.1f} | {r.engine_tokens:,} ({r.trained_gen_tokens:,}) | {r.recomputed_tokens:,} |"
        )
    lines.append("")
    for r in results:
        if r.eta == 0:
            continue
        lines.append(
            f"- {r.name} (eta={r.eta}) / synchronous: throughput {r.trajectories_per_s / sync.trajectories_per_s:.2f}x, "
            f"wall {sync.wall_s / r.wall_s:.2f}x faster, trained tokens/s "
            f"{r.trained_tokens_per_s / max(sync.trained_tokens_per_s, 1e-9):.2f}x"
        )
    best = max((r for r in results if r.eta >= 2), key=lambda r: r.trajectories_per_s)
    lines.append("")
    lines.append(f"async/sync throughput ratio: {best.trajectories_per_s / sync.trajectories_per_s:.2f}")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="training steps S per setting")
    p.add_argument("--batch", type=int, default=8, help="B: groups per step")
    p.add_argument("--group", type=int, default=4, help="n: samples per group (>= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--etas", default="0,1,2,4", help="settings to run (0 = synchronous baseline, required)")
    p.add_argument("--max-concurrent", type=int, default=None, help="groups in flight (default 4 x B)")
    p.add_argument("--min-turns", type=int, default=2, help="turns of the shortest questions")
    p.add_argument("--max-turns", type=int, default=60, help="turns of the longest questions (30x the shortest)")
    p.add_argument("--alpha", type=float, default=1.0, help="Pareto tail index of the turn counts")
    p.add_argument("--long-turns", type=int, default=None, help="a 'long' question (default max-turns / 2)")
    p.add_argument("--new-tokens", type=int, default=12, help="sampled tokens per turn")
    p.add_argument(
        "--prox",
        choices=["loglinear", "recompute"],
        default="loglinear",
        help="trainer's proximal log-probs; loglinear is exact for eta=0, so sync pays for no extra forward",
    )
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-positions", type=int, default=2048)
    p.add_argument("--verbose", action="store_true", help="print every step's timings")
    p.add_argument("--quick", action="store_true", help="tiny sizes for the smoke test (seconds)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/async_vs_sync.md")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.group = min(args.steps, 3), min(args.batch, 2), min(args.group, 2)
        args.max_turns, args.new_tokens = min(args.max_turns, 12), min(args.new_tokens, 4)
        args.no_save = True
    args.long_turns = args.long_turns or max(args.min_turns + 1, args.max_turns // 2)
    if args.group < 2:
        p.error(f"--group must be >= 2 (the reward alternates within a group), got {args.group}")
    args.eta_list = sorted({int(e) for e in args.etas.split(",")})
    if 0 not in args.eta_list or not any(e >= 2 for e in args.eta_list):
        p.error(f"--etas must include 0 (the baseline) and one eta >= 2, got {args.etas!r}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # engine decode thread and trainer worker thread: one core each
    B, n = args.batch, args.group
    C = args.max_concurrent or 4 * B
    # Enough questions for the most eager setting: (eta + 1) B groups ahead of training, plus rejections.
    turns = heavy_tailed_turns(
        (args.steps + max(args.eta_list) + 2) * B * 4,
        low=args.min_turns,
        high=args.max_turns,
        alpha=args.alpha,
        seed=args.seed,
    )
    load0 = os.getloadavg()
    print(
        f"workload: S={args.steps} steps x B={B} groups x n={n} samples = {args.steps * B * n} trained trajectories "
        f"per setting; turns per question Pareto(alpha={args.alpha}) in [{args.min_turns}, {args.max_turns}] "
        f"(first {args.steps * B}: mean {sum(turns[: args.steps * B]) / (args.steps * B):.1f}, "
        f"max {max(turns[: args.steps * B])}); {args.new_tokens} new tokens/turn; max_concurrent={C} groups "
        f"({C * n} engine rows); load average {load0[0]:.2f}",
        flush=True,
    )
    asyncio.run(_warm_up(args))
    results = []
    for eta in args.eta_list:
        r = asyncio.run(run_setting(eta, args, turns))
        print(
            f"  eta={eta}: {r.wall_s:.1f} s, {r.trajectories_per_s:.2f} traj/s, idle {r.idle_fraction:.2f}",
            flush=True,
        )
        results.append(r)
    load1 = os.getloadavg()
    header = (
        f"# Asynchronous vs synchronous RL\n\n`bench/async_vs_sync.py {' '.join(sys.argv[1:] if argv is None else argv)}` "
        f"on {os.cpu_count()} CPUs, torch {torch.__version__}, 1 torch thread each for engine and trainer; "
        f"load average {load0[0]:.2f} before, {load1[0]:.2f} after. S={args.steps}, B={B}, n={n}, "
        f"max_concurrent={C} groups, {args.new_tokens} tokens/turn, turns {args.min_turns}..{args.max_turns} "
        f"(Pareto alpha={args.alpha})."
    )
    report = format_report(results, header)
    print(report)
    if not args.no_save:
        atomic_write_text(RESULTS, report + "\n")
    return 0


async def _warm_up(args: argparse.Namespace) -> None:
    """One throwaway step so first-call costs (allocator, kernels) do not land on the first setting."""
    warm = argparse.Namespace(**{**vars(args), "steps": 1, "batch": 1, "group": 2, "max_concurrent": 1})
    await run_setting(0, warm, [2] * 4)


if __name__ == "__main__":
    sys.exit(main())
