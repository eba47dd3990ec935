"""Fully asynchronous vs synchronous RL throughput on a heavy-tailed multi-turn workload (issue 5 §6).

The real parts train a tiny random Qwen2 for the same S steps of B groups x n samples on the same
seeded questions, once per setting: eta = 0 (synchronous), 1 (one-step-off), 2 and 4 (fully
asynchronous). Generation runs in its own process, `asearch engine serve` (the in-process engine
behind SGLang's protocol, one torch thread), which this process drives over HTTP with `SGLangEngine`
like a trainer drives an SGLang server; the trainer (one torch thread), the agent loops and the rollout
controller run here. Weights travel through disk after every step (save -> /update_weights_from_disk).
`--engine inprocess` puts the engine in this process instead.

Question i takes k_i turns, k heavy-tailed (Pareto, 2..60 by default: a 30x spread). Every turn is a
real LLM call of `--new-tokens` sampled tokens followed by a "keep searching" observation; a random
policy never answers, so an episode ends at its question's k (`max_turns`) and the work is set by k,
not luck. The controller's `batch_order=admitted` (the default here) makes every setting train the
same groups, so the ratio compares equal work.

    .venv/bin/python bench/async_vs_sync.py            # full run, a few minutes on 2 quiet cores
    .venv/bin/python bench/async_vs_sync.py --quick    # tiny sizes, seconds (the smoke test)

Prints the table, the ratios against the synchronous run and an equal-work check (long groups trained
vs the synchronous run), then ends with `async/sync throughput ratio: X.XX` for the best fully
asynchronous setting (eta >= 2). Full runs also write bench/results/async_vs_sync.md; `--json PATH`
writes the raw numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from asearch.files import atomic_write_json, atomic_write_text

RESULTS = Path(__file__).parent / "results" / "async_vs_sync.md"

# The observation after every turn. A random policy never writes a well-formed action, so what it
# sees is the agent loop's correction; worded as a search result, the context reads like a search.
KEEP_SEARCHING = "\n<information>\nkeep searching: no answer yet\n</information>\n"
SYSTEM_PROMPT = (
    "Find the fact. Search with <search>query</search> as often as you need; "
    "results appear in <information></information>."
)


# --------------------------------------------------------------------------- workload


def heavy_tailed_turns(n: int, *, low: int, high: int, alpha: float, seed: int) -> list[int]:
    """n turn counts, Pareto(alpha) with scale `low` cut at `high`: mostly near `low`, a few at `high`.

    alpha = 1: P(k >= x) = low / x, so with 2..60 one question in 15 needs 30+ turns.
    """
    rng = random.Random(seed)
    return [min(high, int(low / (1.0 - rng.random()) ** (1.0 / alpha))) for _ in range(n)]


def question_stream(turns: Sequence[int]) -> Iterator[tuple[int, dict[str, Any]]]:
    """(position, question) pairs in one fixed order, the same for every setting."""
    for i, k in enumerate(turns):
        yield i, {"id": i, "question": f"Which search result {i} tells the fact number {i}?", "turns": k}


def build_policy(seed: int, hidden: int, layers: int, max_positions: int):
    """A random tiny Qwen2 and a byte-level BPE tokenizer trained on the strings the episodes contain."""
    from asearch.models import build_tiny_model, train_bpe_tokenizer

    # the chat template's role lines are in the context of every turn: give them merges too
    texts = [SYSTEM_PROMPT, KEEP_SEARCHING, "Question: Which search result tells the fact number?"] * 50
    texts += ["<|im_start|>system\n", "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"] * 50
    tok = train_bpe_tokenizer(texts, vocab_size=384)  # 256 bytes + specials + merges of these strings
    model = build_tiny_model(
        tok, hidden=hidden, layers=layers, heads=max(2, hidden // 32), max_positions=max_positions, seed=seed
    )
    return model, tok


# --------------------------------------------------------------------------- one setting


@dataclass
class SettingResult:
    """What one eta did with the same S x B x n trained trajectories."""

    name: str
    eta: int
    wall_s: float
    cores_used: float  # CPU seconds of both processes / wall: above 1 only if they really overlapped
    bench_cpu_s: float  # this process: trainer, agent loops, controller (+ the engine if in-process)
    generator_cpu_s: float  # the engine server's process (0 with --engine inprocess)
    train_cpu_s: float  # CPU time of the trainer's thread in train_step (part of bench_cpu_s)
    trained_trajectories: int
    idle_fraction: float  # controller: share of wall time with no group generating
    rollout_wait_s: float  # trainer side: waiting for a batch
    train_s: float  # trainer side: the policy update (worker thread)
    weight_sync_s: float  # pushing weights into the engine + bumping the version
    staleness_mean: float  # version trained at - oldest version of a trajectory's tokens
    staleness_max: int
    rejected: dict[str, int]
    trained_turns_mean: float
    trained_turns_max: int
    long_groups_trained: int  # groups of questions with >= --long-turns turns
    cut_short: int  # trained episodes that ended before their question's k turns (context full)
    trained_gen_tokens: int
    train_tokens: int  # every token the trainer saw (context included)
    engine_tokens: int  # every token the engine sampled (cancelled and not-yet-trained work included)
    engine_mean_batch: float  # rows per decode step: how full the engine's batch was
    prefill_tokens: int
    recomputed_tokens: int  # K/V recomputed after in-flight weight updates
    groups_started: int

    @property
    def trajectories_per_s(self) -> float:
        return self.trained_trajectories / max(self.wall_s, 1e-9)

    @property
    def trained_tokens_per_s(self) -> float:
        return self.trained_gen_tokens / max(self.wall_s, 1e-9)


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """fn's result and the CPU seconds of the calling thread while it ran."""
    t = time.thread_time()
    out = fn(*args, **kwargs)
    return out, time.thread_time() - t


def setting_name(eta: int) -> str:
    return {0: "synchronous", 1: "one-step-off"}.get(eta, "fully async")


class EnvLatency:
    """An engine whose every call is followed by a wait: the search call of the turn.

    The random policy never writes a valid action, so no tool runs; this stands in for the tool's
    latency (a retrieval server, a web search) without using CPU, identically in every setting.
    Fixed (`p99_s` None): `median_s` after every turn. Heavy-tailed: log-normal with median `median_s`
    and 99th percentile `p99_s`, i.e. `median_s * exp(sigma * z)`, z ~ N(0, 1), sigma = ln(p99 / p50) / 2.326,
    drawn from (seed, trajectory, turn) so every setting waits the same on the same turn.
    """

    def __init__(self, engine: Any, median_s: float, *, p99_s: float | None = None, seed: int = 0):
        self._engine, self._median, self._seed = engine, median_s, seed
        self._sigma = 0.0 if p99_s is None else math.log(p99_s / median_s) / 2.3263
        self._turns: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def wait_s(self, trajectory_id: str) -> float:
        turn = self._turns.get(trajectory_id, 0)
        self._turns[trajectory_id] = turn + 1
        if not self._sigma:
            return self._median
        z = random.Random(f"{self._seed}:{trajectory_id}:{turn}").gauss(0.0, 1.0)
        return self._median * math.exp(self._sigma * z)

    async def generate(self, request: Any) -> Any:
        resp = await self._engine.generate(request)
        await asyncio.sleep(self.wait_s(request.trajectory_id))
        return resp


class Generator:
    """The generation side of one setting: an engine, how weights reach it, and its counters.

    `server` (the default): `asearch engine serve` in its own process with one torch thread, driven over
    HTTP by `SGLangEngine`, the way a trainer drives an SGLang or vLLM server; each update saves the
    policy (safetensors) and the server loads it (`/update_weights_from_disk`; running requests are frozen in
    place and go on with their KV cache, or with `--update-kv recompute` aborted and resent by the client with
    their tokens so far). `inprocess`: `InProcessEngine` in the
    bench process, updated from the live state dict (trainer and engine then share one process).
    """

    def __init__(self, engine: Any, *, url: str | None = None, weights_dir: Path | None = None):
        from asearch.engine.remote.http import JsonHttpClient

        self.engine = engine
        self.url = url
        self.weights_dir = weights_dir
        self.admin = None if url is None else JsonHttpClient(url, what="engine server")
        self._base: dict[str, Any] = {}

    @classmethod
    async def open(cls, args: argparse.Namespace, policy: Any, tok: Any, server: Any) -> Generator:
        rows = args.max_concurrent * args.group
        if server is None:
            from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig

            cfg = InProcessEngineConfig(
                threads=1, max_batch=rows, max_seq_len=args.max_positions, seed=args.seed, update_kv=args.update_kv
            )
            return cls(InProcessEngine(policy, tok, cfg=cfg))
        from asearch.engine.registry import EngineConfig, make_engine

        url, init_dir, weights_dir = server
        http = {"timeout_s": 600, "retries": 2, "max_concurrency": rows + 8}
        engine = make_engine(EngineConfig(kind="sglang", base_url=url, http=http, update_kv=args.update_kv))
        gen = cls(engine, url=url, weights_dir=weights_dir)
        # every setting starts from the same weights, labelled version 0, with empty caches
        await gen.admin.post_json(
            "/update_weights_from_disk",
            {"model_path": str(init_dir), "weight_version": "0", "abort_all_requests": True},
        )
        gen._base = await gen._info()
        return gen

    async def _info(self) -> dict[str, Any]:
        assert self.admin is not None
        return await self.admin.get_json("/get_server_info")

    async def push(self, policy: Any, version: int) -> None:
        if self.url is None:
            await self.engine.update_weights(policy.state_dict(), version)
            return
        assert self.weights_dir is not None
        path = self.weights_dir / f"v{version % 2}"  # the server has loaded v-1 before v is written
        await asyncio.to_thread(policy.save_pretrained, path)
        await self.engine.update_weights(path, version)

    async def cpu_s(self) -> float:
        """CPU seconds of the generator's own process (0 in-process: the bench's process time has it)."""
        return 0.0 if self.url is None else float((await self._info())["process_cpu_s"])

    async def stats(self) -> dict[str, Any]:
        if self.url is None:
            return self.engine.stats()
        now, base = (await self._info())["internal_states"][0], self._base["internal_states"][0]
        out = {
            k: now[k] - base[k]
            for k in ("tokens_generated", "decode_steps", "prefill_tokens", "recomputed_tokens")
        }
        out["mean_batch_size"] = out["tokens_generated"] / max(out["decode_steps"], 1)
        return out

    async def close(self) -> None:
        await self.engine.close()
        if self.admin is not None:
            await self.admin.aclose()


async def run_setting(
    eta: int, args: argparse.Namespace, turns: Sequence[int], server: Any = None
) -> SettingResult:
    """Train `args.steps` steps at max_staleness = eta, from the same initial policy and questions.

    The step is `asearch.rl.loop.TrainingLoop`'s: wait for B groups -> advantages -> `train_step` in a worker
    thread (the event loop keeps driving episodes) -> push weights (in-flight requests continue under
    them) -> bump the version. Checkpoints, logging and evaluation are left out: they cost the same
    in every setting.
    """
    from asearch.agent.loop import AgentConfig, run_episode
    from asearch.rl.controller import ControllerConfig, RolloutController
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig, groups_to_samples

    torch.manual_seed(args.seed)
    policy, tok = build_policy(args.seed, args.hidden, args.layers, args.max_positions)
    B, n, C = args.batch, args.group, args.max_concurrent
    trainer_cfg = TrainerConfig(seed=args.seed, prox=args.prox, attention=args.attention)
    trainer = PolicyTrainer(policy, trainer_cfg, temperature=1.0, total_steps=args.steps)
    gen = await Generator.open(args, policy, tok, server)
    engine = gen.engine
    base_agent = AgentConfig(
        style="search-r1",
        # search is the only action, so no sampled "</answer>" can end an episode before its k turns
        style_options={
            "system_prompt": SYSTEM_PROMPT,
            "correction_template": KEEP_SEARCHING,
            "actions": ("search",),
            "act_prefixes": (),
        },
        max_new_tokens=args.new_tokens,
        max_context_tokens=args.max_positions,
        temperature=1.0,
    )
    agents = {k: base_agent.model_copy(update={"max_turns": k}) for k in set(turns)}

    p99 = None if args.env_latency_p99_ms is None else args.env_latency_p99_ms / 1000
    agent_engine = (
        engine if args.env_latency_ms <= 0 else EnvLatency(engine, args.env_latency_ms / 1000, p99_s=p99, seed=args.seed)
    )

    async def episode(sample: dict[str, Any], k: int):
        traj = await run_episode(
            agent_engine,
            tok,
            {},  # no tool is ever called: the policy is random (see KEEP_SEARCHING)
            sample["question"],
            agents[sample["turns"]],
            trajectory_id=f"q{sample['id']}-{k}",
            seed=(args.seed * 1_000_003 + sample["id"]) * 1024 + k,  # same tokens' seeds in every setting
            metadata={"k": k},
        )
        # Throughput does not depend on what is rewarded; 0/1 alternating within a group gives every
        # group a nonzero advantage (none dropped as zero-variance), identically in every setting.
        traj.reward = float(k % 2)
        return traj

    controller = RolloutController(
        ControllerConfig(
            batch_size=B, group_size=n, max_staleness=eta, max_concurrent=C, batch_order=args.batch_order
        ),
        question_stream(turns),
        episode,
    )
    wait_s = train_s = sync_s = train_cpu_s = 0.0
    staleness: list[int] = []
    trained_turns: list[int] = []
    trained_tokens = trained = train_tokens = long_trained = cut_short = 0
    version = 0
    t_start, cpu_start, gen_cpu_start = time.perf_counter(), time.process_time(), await gen.cpu_s()
    controller.start()
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter()
            batch = await controller.get_batch()
            if batch is None:
                raise RuntimeError(f"eta={eta}: ran out of questions after {controller.data_position}")
            t1 = time.perf_counter()
            samples, _ = groups_to_samples(
                [g.rewards for g in batch], [g.trajectories for g in batch], trainer.cfg.advantages
            )
            stats, cpu = await asyncio.to_thread(_timed, trainer.train_step, samples, policy_version=version)
            train_cpu_s += cpu
            t2 = time.perf_counter()
            version += 1
            await gen.push(policy, version)
            controller.set_version(version)
            t3 = time.perf_counter()
            wait_s, train_s, sync_s = wait_s + t1 - t0, train_s + t2 - t1, sync_s + t3 - t2
            train_tokens += int(stats["perf/train_tokens"])
            for g in batch:
                long_trained += g.sample["turns"] >= args.long_turns
                for t in g.trajectories:
                    cut_short += t.num_turns != g.sample["turns"]
                    staleness.append(max(0, version - 1 - t.min_version))
                    trained_turns.append(t.num_turns)
                    trained_tokens += t.generated_tokens
                    trained += 1
            if args.verbose:
                print(
                    f"    eta={eta} step {version}: wait {t1 - t0:.2f}s, train {t2 - t1:.2f}s "
                    f"({int(stats['perf/train_tokens'])} tokens), sync {t3 - t2:.2f}s, "
                    f"turns {[g.sample['turns'] for g in batch]}",
                    flush=True,
                )
        wall = time.perf_counter() - t_start
        own_cpu, gen_cpu = time.process_time() - cpu_start, await gen.cpu_s() - gen_cpu_start
        idle = controller.idle_fraction()
        rejected = dict(controller.rejected)  # before close(): its cancellations are not rejections
        started = controller.data_position
        es = await gen.stats()
    finally:
        await controller.close()
        await gen.close()
    cores = (own_cpu + gen_cpu) / wall
    return SettingResult(
        name=setting_name(eta),
        eta=eta,
        wall_s=wall,
        cores_used=cores,
        bench_cpu_s=own_cpu,
        train_cpu_s=train_cpu_s,
        generator_cpu_s=gen_cpu,
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
        long_groups_trained=long_trained,
        cut_short=cut_short,
        trained_gen_tokens=trained_tokens,
        train_tokens=train_tokens,
        engine_tokens=int(es["tokens_generated"]),
        engine_mean_batch=float(es["mean_batch_size"]),
        prefill_tokens=int(es["prefill_tokens"]),
        recomputed_tokens=int(es["recomputed_tokens"]),
        groups_started=started,
    )


# --------------------------------------------------------------------------- report


def best_async(results: Sequence[SettingResult]) -> SettingResult:
    return max((r for r in results if r.eta >= 2), key=lambda r: r.trajectories_per_s)


def format_report(results: Sequence[SettingResult], header: str, long_turns: int) -> str:
    sync = next(r for r in results if r.eta == 0)

    def rel(r: SettingResult) -> str:
        return f"{r.trajectories_per_s / sync.trajectories_per_s:.2f}x"

    out = [
        header,
        "",
        "| setting | eta | wall s | trajectories/s | vs sync | generator idle | staleness mean/max | rejected groups "
        "| CPU cores used |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rej = ", ".join(f"{k} {v}" for k, v in sorted(r.rejected.items())) or "0"
        out.append(
            f"| {r.name} | {r.eta} | {r.wall_s:.1f} | {r.trajectories_per_s:.2f} | {rel(r)} | {r.idle_fraction:.2f} "
            f"| {r.staleness_mean:.2f}/{r.staleness_max} | {rej} | {r.cores_used:.2f} |"
        )
    out += [
        "",
        "Where the time went (trainer side) and what was trained:",
        "",
        f"| eta | rollout wait s | train s | weight sync s | trained turns mean/max | long groups trained "
        f"(>= {long_turns} turns) | trained gen tokens/s | train tokens | engine rows/step | tokens sampled "
        "(trained) | prefill + recomputed tokens |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        out.append(
            f"| {r.eta} | {r.rollout_wait_s:.1f} | {r.train_s:.1f} | {r.weight_sync_s:.2f} "
            f"| {r.trained_turns_mean:.1f}/{r.trained_turns_max} | {r.long_groups_trained} "
            f"| {r.trained_tokens_per_s:,.0f} | {r.train_tokens:,} | {r.engine_mean_batch:.1f} "
            f"| {r.engine_tokens:,} ({r.trained_gen_tokens:,}) | {r.prefill_tokens:,} + {r.recomputed_tokens:,} |"
        )
    out.append("")
    for r in results:
        if r.eta == 0:
            continue
        out.append(
            f"- {r.name} (eta={r.eta}) / synchronous: trajectories/s {rel(r)}, trained generated tokens/s "
            f"{r.trained_tokens_per_s / max(sync.trained_tokens_per_s, 1e-9):.2f}x"
        )
    out.append("")
    skewed = [r for r in results if r.long_groups_trained < sync.long_groups_trained]
    if skewed:
        out.append(
            "equal-work check: FAILED for eta="
            + ", ".join(str(r.eta) for r in skewed)
            + f": the synchronous run trained {sync.long_groups_trained} long groups, these fewer (a long "
            "group is overtaken by later short ones and, once it outlives the staleness bound, cancelled), "
            "so their trajectories/s counts shorter trajectories; compare trained generated tokens/s."
        )
    else:
        out.append("equal-work check: every setting trained as many long groups as the synchronous run.")
    for r in results:
        if r.cut_short:
            out.append(
                f"warning: eta={r.eta}: {r.cut_short} trained episodes ended before their k turns "
                "(context full): raise --max-positions"
            )
    best = best_async(results)
    out.append(f"async/sync throughput ratio: {best.trajectories_per_s / sync.trajectories_per_s:.2f}")
    return "\n".join(out)


# --------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="training steps S per setting")
    p.add_argument("--batch", type=int, default=8, help="B: groups per step")
    p.add_argument("--group", type=int, default=4, help="n: samples per group (>= 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--etas", default="0,1,2,4", help="settings to run: must include 0 and one eta >= 2")
    p.add_argument(
        "--max-concurrent",
        type=int,
        default=None,
        help="groups in flight, the same in every setting (default: (largest eta + 1) x B, the product's default "
        "rollout.max_concurrent at that eta; before 2026-11-27 the default was 4 x B, which capped eta 8 at 3 steps ahead)",
    )
    p.add_argument(
        "--batch-order",
        choices=["finished", "admitted"],
        default="admitted",
        help="ControllerConfig.batch_order. admitted (default): every setting trains the same groups, so "
        "the ratio compares equal work; finished: async drops long groups as stale (see docs/bench.md)",
    )
    p.add_argument(
        "--engine",
        choices=["server", "inprocess"],
        default="server",
        help="server: the generator in its own process (asearch engine serve), weights via disk; "
        "inprocess: engine and trainer share this process",
    )
    p.add_argument("--min-turns", type=int, default=2, help="turns of the shortest questions")
    p.add_argument("--max-turns", type=int, default=60, help="turns of the longest questions")
    p.add_argument("--alpha", type=float, default=1.0, help="Pareto tail index of the turn counts")
    p.add_argument("--long-turns", type=int, default=None, help="a 'long' question (default max-turns / 2)")
    p.add_argument("--new-tokens", type=int, default=12, help="sampled tokens per turn")
    p.add_argument(
        "--env-latency-ms",
        type=float,
        default=0.0,
        help="time the environment takes after every turn (a search call that waits on a server); "
        "uses no CPU. 0 = instantaneous observations",
    )
    p.add_argument(
        "--env-latency-p99-ms",
        type=float,
        default=None,
        help="make the latency heavy-tailed: log-normal with median --env-latency-ms and this 99th percentile "
        "(2000 with a median of 200: a web search API); the same draw per turn in every setting",
    )
    p.add_argument(
        "--prox",
        choices=["loglinear", "recompute"],
        default="loglinear",
        help="trainer's proximal log-probs; loglinear is exact at eta=0, so sync pays for no extra forward",
    )
    p.add_argument(
        "--attention",
        choices=["auto", "model", "eager", "sdpa"],
        default="auto",
        help="trainer.attention: auto (the default) SDPA for micro-batches of 384+ tokens, the model's eager "
        "attention below; model or eager: eager throughout (the default before 2026-11-27); sdpa throughout",
    )
    p.add_argument(
        "--update-kv",
        choices=["recompute", "keep"],
        default="keep",
        help="the engine's update_kv: keep (the product's default since 2026-11-27; an in-flight update: requests "
        "go on with their KV cache) or recompute (abort, resend, prefill again after every weight push)",
    )
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument(
        "--max-positions", type=int, default=4096, help="context of model and engine: must hold k turns"
    )
    p.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    p.add_argument("--verbose", action="store_true", help="print every step's timings")
    p.add_argument("--quick", action="store_true", help="tiny sizes for the smoke test (seconds)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results/async_vs_sync.md")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.group = min(args.steps, 3), min(args.batch, 2), min(args.group, 2)
        args.max_turns, args.new_tokens = min(args.max_turns, 12), min(args.new_tokens, 4)
        args.no_save = True
    # the product's default (rollout.max_concurrent unset: (eta + 1) x B) at the largest eta run; the same in every
    # setting, where the staleness rule admits fewer anyway
    etas = [int(e) for e in args.etas.split(",") if e.strip()]
    args.max_concurrent = args.max_concurrent or (max(etas, default=0) + 1) * args.batch
    args.long_turns = args.long_turns or max(args.min_turns + 1, args.max_turns // 2)
    if args.group < 2:
        p.error(f"--group must be >= 2 (the reward alternates within a group), got {args.group}")
    if not 1 <= args.min_turns <= args.max_turns:
        p.error(f"need 1 <= --min-turns <= --max-turns, got {args.min_turns} and {args.max_turns}")
    if args.env_latency_p99_ms is not None and not 0 < args.env_latency_ms < args.env_latency_p99_ms:
        p.error(f"--env-latency-p99-ms needs 0 < --env-latency-ms < it, got {args.env_latency_ms:g} and {args.env_latency_p99_ms:g}")
    try:
        args.eta_list = sorted({int(e) for e in args.etas.split(",")})
    except ValueError:
        p.error(f"--etas must be comma-separated integers, got {args.etas!r}")
    if 0 not in args.eta_list or not any(e >= 2 for e in args.eta_list) or min(args.eta_list) < 0:
        p.error(f"--etas must include 0 (the baseline) and one eta >= 2, got {args.etas!r}")
    return args


async def _warm_up(args: argparse.Namespace, server: Any) -> None:
    """One throwaway step so first-call costs (allocator, kernels) do not land on the first setting."""
    warm = argparse.Namespace(**{**vars(args), "steps": 1, "batch": 1, "max_concurrent": 1, "verbose": False})
    await run_setting(0, warm, [2] * 8, server)


@contextlib.contextmanager
def generation_server(args: argparse.Namespace) -> Iterator[Any]:
    """With --engine server: one `asearch engine serve` process (1 torch thread) for every setting."""
    if args.engine != "server":
        yield None
        return
    from asearch.engine.server.app import launch_engine_server
    from asearch.models import save_tiny

    policy, tok = build_policy(args.seed, args.hidden, args.layers, args.max_positions)
    with tempfile.TemporaryDirectory(prefix="async-vs-sync-") as tmp:
        init_dir = save_tiny(policy, tok, Path(tmp) / "init")
        sup, url = launch_engine_server(
            init_dir,
            log_path=Path(tmp) / "server.log",
            threads=1,
            max_batch=args.max_concurrent * args.group,
            max_seq_len=args.max_positions,
            seed=args.seed,
            weight_version="0",
        )
        try:
            yield url, init_dir, Path(tmp)
        finally:
            sup.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # the engine's decode thread and the trainer's worker thread: one core each
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # save_pretrained's bar on every weight push
    B, n, S, C = args.batch, args.group, args.steps, args.max_concurrent
    # Enough questions for the most eager setting: it runs ahead by (eta + 1) B and may drop many.
    turns = heavy_tailed_turns(
        (S + max(args.eta_list) + 2) * B * 4,
        low=args.min_turns,
        high=args.max_turns,
        alpha=args.alpha,
        seed=args.seed,
    )
    first = turns[: S * B]
    load0 = os.getloadavg()
    print(
        f"workload: S={S} steps x B={B} groups x n={n} = {S * B * n} trained trajectories per setting; turns per "
        f"question Pareto(alpha={args.alpha}) in [{args.min_turns}, {args.max_turns}]; the first {S * B} "
        f"questions: mean {sum(first) / len(first):.1f} turns, max {max(first)}, "
        f"{sum(k >= args.long_turns for k in first)} with >= {args.long_turns}; {args.new_tokens} new tokens/turn; "
        f"max_concurrent={C} groups ({C * n} engine rows); load average {load0[0]:.2f}",
        flush=True,
    )
    results = []
    with generation_server(args) as server:
        asyncio.run(_warm_up(args, server))
        for eta in args.eta_list:
            r = asyncio.run(run_setting(eta, args, turns, server))
            print(
                f"  eta={eta}: {r.wall_s:.1f} s, {r.trajectories_per_s:.2f} trajectories/s, "
                f"idle {r.idle_fraction:.2f}, CPU cores used {r.cores_used:.2f} (CPU s: bench {r.bench_cpu_s:.1f} "
                f"of which trainer {r.train_cpu_s:.1f}, generator {r.generator_cpu_s:.1f})",
                flush=True,
            )
            results.append(r)
    load1 = os.getloadavg()
    command = " ".join(sys.argv[1:] if argv is None else argv)
    header = (
        f"# Asynchronous vs synchronous RL\n\n`bench/async_vs_sync.py {command}` on {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, one torch thread each for the engine and the trainer; load average "
        f"{load0[0]:.2f} before, {load1[0]:.2f} after (other processes on a shared box slow every row). "
        f"S={S}, B={B}, n={n}, max_concurrent={C} groups, {args.new_tokens} tokens/turn, turns "
        f"{args.min_turns}..{args.max_turns} (Pareto alpha={args.alpha}), Qwen2 d={args.hidden} x "
        f"{args.layers} layers, {args.attention} attention in the trainer, prox={args.prox}, batch_order={args.batch_order}, engine={args.engine}, update_kv={args.update_kv}, "
        f"environment latency {args.env_latency_ms:g} ms/turn"
        + ("." if args.env_latency_p99_ms is None else f" median, log-normal, p99 {args.env_latency_p99_ms:g} ms.")
    )
    report = format_report(results, header, args.long_turns)
    print(report)
    if not args.no_save:
        atomic_write_text(RESULTS, report + "\n")
    if args.json is not None:
        atomic_write_json(
            args.json,
            {
                "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
                "load_average": [load0[0], load1[0]],
                "results": [{**asdict(r), "trajectories_per_s": r.trajectories_per_s} for r in results],
                "async_sync_ratio": best_async(results).trajectories_per_s
                / next(r for r in results if r.eta == 0).trajectories_per_s,
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
