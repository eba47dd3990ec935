"""Workload draws (parametric and measured) and config errors of the simulator."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from asearch.config import load_config
from asearch.errors import ConfigError, DataFormatError
from asearch.sim import Dist, SimConfig
from asearch.sim.config import WorkloadConfig
from asearch.sim.workload import Stream, Workload, load_measured, sample


def test_pareto_turns_are_the_bench_questions():
    # bench/async_vs_sync.py heavy_tailed_turns: min(high, int(low / (1 - u) ** (1 / alpha))), u from Random(seed)
    rng = random.Random(7)
    expected = [min(60, int(2 / (1.0 - rng.random()) ** (1.0 / 1.0))) for _ in range(300)]
    turns = Dist(kind="pareto", min=2, max=60, alpha=1.0, integer=True)
    small = Dist(value=10)  # 60 turns fit the context
    wl = Workload(
        WorkloadConfig(turns=turns, prompt_tokens=small, obs_tokens=small, gen_tokens=small), seed=7
    )
    got = [len(wl.group(3)[0].turns) for _ in range(300)]
    assert got == expected


def test_distribution_means_caps_and_integers():
    s = Stream("t")
    x = sample(Dist(kind="lognormal", mean=300, cv=1.0), s, 200_000)
    assert x.mean() == pytest.approx(300, rel=0.02)
    capped = sample(Dist(kind="lognormal", mean=300, cv=1.0, max=400, min=10), s, 10_000)
    assert capped.max() <= 400 and capped.min() >= 10
    whole = sample(Dist(kind="fixed", value=11.6, integer=True), s, 100_000)
    assert set(np.unique(whole)) == {11.0, 12.0} and whole.mean() == pytest.approx(11.6, abs=0.01)
    assert set(sample(Dist(kind="choice", values=[1, 5]), s, 1000)) == {1.0, 5.0}
    u = sample(Dist(kind="uniform", min=2, max=3), s, 1000)
    assert 2 <= u.min() and u.max() <= 3


def test_pareto_mean_solves_alpha():
    d = Dist(kind="pareto", min=2, mean=10, max=32, integer=False)
    x = sample(d, Stream("p"), 200_000)
    assert x.mean() == pytest.approx(10, rel=0.02) and x.max() <= 32
    assert Dist(kind="pareto", min=2, alpha=1.5).pareto_alpha() == 1.5


def test_context_cap_ends_trajectories():
    cfg = WorkloadConfig(turns=Dist(value=50), prompt_tokens=Dist(value=100), obs_tokens=Dist(value=100),
                         gen_tokens=Dist(value=50), max_context=1000)  # fmt: skip
    shape = Workload(cfg, 0).group(1)[0]
    assert shape.train_tokens <= 1000 and len(shape.turns) < 50
    assert shape.turns[0].context == 100 and shape.turns[1].context == 250 and shape.turns[1].new == 100


def test_groups_share_turns_only_when_asked():
    d = {"turns": Dist(kind="pareto", min=1, max=40, alpha=0.8, integer=True)}
    shared = Workload(WorkloadConfig(**d, turns_shared_in_group=True), 0).group(16)
    apart = Workload(WorkloadConfig(**d, turns_shared_in_group=False), 0).group(16)
    assert len({len(s.turns) for s in shared}) == 1
    assert len({len(s.turns) for s in apart}) > 1


def _trajectory(n_turns: int, group: int) -> dict:
    turns, ctx = [], 50
    for _ in range(n_turns):
        turns.append({"prompt_tokens": ctx, "output_tokens": 10, "tool_latency_s": 0.5, "segment": 0})
        ctx += 10 + 20
    return {"step": 1, "group": group, "turns": turns, "segments": [{"token_ids": [1] * (ctx - 20)}]}


def test_measured_trajectories_from_a_run_dir(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    lines = [_trajectory(3, 0), _trajectory(3, 0), _trajectory(5, 1)]
    (run / "trajectories.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    groups = load_measured(run)
    assert [len(g) for g in groups] == [2, 1]
    s = groups[1][0]
    assert [t.new for t in s.turns] == [50, 20, 20, 20, 20]  # new tokens since the last call
    assert s.train_tokens == 50 + 5 * 30 - 20 and s.turns[0].tool_s == 0.5
    cfg = load_config(
        SimConfig, None, [f"workload.source={run}", "workload.tool_latency_s=measured", "group_size=4"]
    )
    wl = Workload(cfg.workload, 0)
    for _ in range(10):
        g = wl.group(4)
        assert len({len(x.turns) for x in g}) == 1  # one measured group, its members cycled


def test_measured_summary_records(tmp_path):
    p = tmp_path / "lens.json"
    p.write_text(json.dumps([{"turns": 4, "gen_tokens": 40, "prompt_tokens": 100, "obs_tokens": 30}]))
    (s,) = load_measured(p)[0]
    assert [t.gen for t in s.turns] == [10] * 4 and [t.new for t in s.turns] == [100, 10, 10, 10]
    assert s.train_tokens == 170
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": "many"}) + "\n")
    with pytest.raises(DataFormatError, match="turns"):
        load_measured(bad)
    with pytest.raises(ConfigError, match="not found"):
        load_measured(tmp_path / "nope.jsonl")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.rollout_gpus=128"], "rollout_gpus < gpus"),
        (["cluster.rolout_gpus=8"], "did you mean 'cluster.rollout_gpus'"),
        (["warmup_steps=30", "steps=20"], "warmup_steps must be < steps"),
        (["workload.turns.kind=pareto", "workload.turns.min=0"], "pareto needs min > 0"),
        (["workload.gen_tokens={kind: lognormal}"], "lognormal needs `mean`"),
        (["workload.tool_latency_s=measured"], "needs a `source`"),
        (["etas=[0, -1]"], "etas must be >= 0"),
        (["cluster.contention=1.5"], "contention"),
        (["rollout.gpus_per_server=8", "cluster.rollout_gpus=4", "cluster.gpus=8"], "not one server"),
    ],
)
def test_config_errors_say_what_is_wrong(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(SimConfig, None, overrides)


def test_reference_config_loads_and_a_number_is_a_fixed_dist():
    cfg = load_config(SimConfig, "configs/sim-reference.yaml")
    assert cfg.cluster.gpus == 128 and cfg.cluster.rollout_gpus == 96 and cfg.cluster.trainer_gpus == 32
    assert cfg.workload.turns.max == 32 and cfg.workload.prompt_tokens.kind == "fixed"
    assert cfg.workload.prompt_tokens.value == 400
