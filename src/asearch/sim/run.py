"""Run the simulator the way `asearch sim` reports it: every eta on the configured split, then the split search."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from asearch.sim.config import SimConfig
from asearch.sim.model import SimResult, simulate


def run_modes(cfg: SimConfig) -> list[SimResult]:
    """Each eta of `cfg.etas` on the configured split, plus the colocated synchronous baseline if asked."""
    out = [simulate(cfg, eta) for eta in cfg.etas]
    if cfg.cluster.colocated_baseline:
        g = cfg.cluster.gpus
        out.append(simulate(cfg, 0, rollout_gpus=g, trainer_gpus=g, colocated=True))
    return out


def split_candidates(cfg: SimConfig) -> list[int]:
    """Rollout GPU counts tried: multiples of split.step_gpus that hold whole servers and leave a trainer."""
    g, tp, step = cfg.cluster.gpus, cfg.rollout.gpus_per_server, cfg.split.step_gpus
    cands = {r for r in range(step, g, step) if r % tp == 0}
    if cfg.cluster.rollout_gpus % tp == 0:
        cands.add(cfg.cluster.rollout_gpus)  # the configured split is always among them
    return sorted(cands)


@dataclass
class SplitSearch:
    results: dict[int, list[SimResult]]  # eta -> one result per candidate split
    best: dict[int, SimResult]  # eta -> the split with the most trained trajectories/s


def split_search(cfg: SimConfig, on_result: Callable[[SimResult], None] | None = None) -> SplitSearch:
    """Every eta at every candidate split (split.steps training steps each); the best split per eta."""
    results: dict[int, list[SimResult]] = {}
    for eta in cfg.etas:
        results[eta] = []
        for r in split_candidates(cfg):
            res = simulate(cfg, eta, rollout_gpus=r, trainer_gpus=cfg.cluster.gpus - r, steps=cfg.split.steps)
            results[eta].append(res)
            if on_result:
                on_result(res)
    best = {eta: max(rs, key=lambda x: x.trajectories_per_s) for eta, rs in results.items()}
    return SplitSearch(results, best)


def describe(cfg: SimConfig, groups: int = 200) -> list[str]:
    """Derived quantities, printed before the runs: servers, trainer throughput, the workload's shape."""
    from asearch.sim.workload import Workload

    wl = Workload(cfg.workload, cfg.seed)
    shapes = [s for _ in range(groups) for s in wl.group(cfg.group_size)]
    turns = sorted(len(s.turns) for s in shapes)
    tokens = [s.train_tokens for s in shapes]
    gen = [s.gen_tokens for s in shapes]
    c, r, t = cfg.cluster, cfg.rollout, cfg.trainer
    per_step = cfg.batch_size * cfg.group_size
    mean_tokens = sum(tokens) / len(tokens)
    return [
        f"cluster: {c.gpus} GPUs = {c.rollout_gpus} rollout ({c.rollout_gpus // r.gpus_per_server} servers of "
        f"{r.gpus_per_server}) + {c.trainer_gpus} trainer ({t.throughput(c.trainer_gpus):,.0f} tokens/s); "
        f"contention {c.contention}",
        f"step: B={cfg.batch_size} groups x n={cfg.group_size} = {per_step} trajectories, "
        f"~{per_step * mean_tokens:,.0f} train tokens (~{per_step * mean_tokens / t.throughput(c.trainer_gpus):,.1f} s "
        f"to train); max_concurrent={cfg.max_concurrent} groups; etas {cfg.etas}; batch_order={cfg.batch_order}",
        f"workload ({len(shapes)} draws): turns mean {sum(turns) / len(turns):.1f}, median {turns[len(turns) // 2]}, "
        f"max {turns[-1]}; tokens per trajectory mean {mean_tokens:,.0f} (generated {sum(gen) / len(gen):,.0f}), "
        f"max {max(tokens):,}",
    ]
