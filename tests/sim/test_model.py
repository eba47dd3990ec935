"""The simulator's event loop: staleness bound, work conservation, idle time, determinism (hypothesis)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asearch.sim import SimConfig, simulate
from asearch.sim.run import run_modes, split_candidates, split_search


def tiny(**over: Any) -> SimConfig:
    """A few servers, B=4 groups of n=2, heavy-tailed turns: each run takes milliseconds."""
    base: dict[str, Any] = {
        "seed": 1,
        "steps": 6,
        "batch_size": 4,
        "group_size": 2,
        "max_concurrent": 8,
        "etas": [0, 1, 3],
        "cluster": {"gpus": 4, "rollout_gpus": 2},
        "rollout": {
            "decode_base_s": 2e-3,
            "decode_per_row_s": 1e-4,
            "kv_read_s_per_token": 1e-7,
            "prefill_s_per_token": 1e-5,
            "max_batch": 64,
        },
        "trainer": {"tokens_per_s_per_gpu": 4000, "step_overhead_s": 0.01, "weight_sync_s": 0.01},
        "workload": {
            "turns": {"kind": "pareto", "min": 1, "max": 30, "alpha": 1.0, "integer": True},
            "prompt_tokens": 20,
            "obs_tokens": {"kind": "lognormal", "mean": 30, "cv": 1.0, "max": 200, "integer": True},
            "gen_tokens": {"kind": "uniform", "min": 5, "max": 20, "integer": True},
            "max_context": 4096,
        },
        "split": {"step_gpus": 1, "steps": 3},
    }
    for key, value in over.items():  # dotted keys: "workload.tool_latency_s" -> nested
        node = base
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return SimConfig.model_validate(base)


# --------------------------------------------------------------------------- invariants, by hand


@pytest.mark.parametrize("eta", [0, 1, 2, 4])
@pytest.mark.parametrize("order", ["finished", "admitted"])
def test_staleness_bound_and_trained_counts(eta, order):
    cfg = tiny(batch_order=order)
    r = simulate(cfg, eta)
    assert r.staleness_max <= eta
    assert r.trained_trajectories == cfg.steps * cfg.batch_size * cfg.group_size
    assert r.engine_tokens >= r.trained_gen_tokens > 0
    assert 0 <= r.rollout_idle <= 1 and 0 <= r.trainer_idle <= 1
    if order == "admitted":
        assert r.rejected.get("stale", 0) == 0  # batches keep admission order: nothing outlives eta


def test_synchronous_run_conserves_work_exactly():
    cfg = tiny()
    r = simulate(cfg, 0)
    # every admitted group is trained, no KV cache is dropped mid-trajectory, nothing is left over
    assert r.engine_tokens == r.trained_gen_tokens
    assert r.prefill_tokens == r.train_tokens - r.trained_gen_tokens
    assert r.recomputed_tokens == 0 and r.staleness_max == 0 and r.rejected == {}
    assert r.groups_started == (cfg.steps + 1) * cfg.batch_size  # the next batch is admitted at the end
    # the trainer waits for rollout, trains, pushes weights, one after the other
    assert r.rollout_wait_s + r.train_s + r.weight_sync_s == pytest.approx(r.wall_s)


def test_train_time_is_tokens_over_throughput():
    cfg = tiny(**{"trainer.step_overhead_s": 0.5, "trainer.attention_equal_tokens": 0})
    r = simulate(cfg, 0)
    throughput = cfg.trainer.throughput(cfg.cluster.trainer_gpus)
    assert r.train_s == pytest.approx(r.train_tokens / throughput + cfg.steps * 0.5)
    assert cfg.trainer.throughput(1) == cfg.trainer.tokens_per_s_per_gpu
    assert cfg.trainer.throughput(4) == pytest.approx(4 * 4000 * 0.97**2)


def test_sync_idles_more_than_async_on_heavy_tails():
    cfg = tiny(steps=10)
    sync, one_off, full = (simulate(cfg, eta) for eta in (0, 1, 3))
    assert sync.rollout_idle > 2 * max(one_off.rollout_idle, full.rollout_idle)  # sync waits for the tail
    assert sync.trainer_idle > one_off.trainer_idle > full.trainer_idle
    assert sync.gpu_idle > one_off.gpu_idle > full.gpu_idle
    assert full.trajectories_per_s > sync.trajectories_per_s


def test_deterministic_for_a_seed_and_replicates_keep_the_questions():
    cfg = tiny()
    a, b = simulate(cfg, 3), simulate(cfg, 3)
    assert a == b
    other = simulate(cfg.model_copy(update={"replicate": 1}), 0)
    same = simulate(cfg, 0)
    assert other.trained_turns_mean == same.trained_turns_mean  # same turn counts per question
    assert other.train_tokens != same.train_tokens  # other token draws
    assert simulate(cfg.model_copy(update={"seed": 2}), 3) != a


def test_contention_slows_overlapping_work():
    free, shared = tiny(), tiny(**{"cluster.contention": 0.5})
    assert simulate(shared, 0).wall_s == pytest.approx(simulate(free, 0).wall_s)  # sync never overlaps
    assert simulate(shared, 3).trajectories_per_s < simulate(free, 3).trajectories_per_s


def test_kv_capacity_bounds_the_batch():
    loose = simulate(tiny(**{"rollout.max_batch": 64}), 3)
    tight = simulate(tiny(**{"rollout.kv_capacity_tokens": 600}), 3)
    assert tight.engine_mean_batch < loose.engine_mean_batch
    assert tight.trained_trajectories == loose.trained_trajectories


def test_weight_updates_recompute_in_flight_contexts():
    on = simulate(tiny(**{"workload.tool_latency_s": 0.05}), 3)
    off = simulate(tiny(**{"workload.tool_latency_s": 0.05, "rollout.recompute_on_update": False}), 3)
    assert on.recomputed_tokens > 0 and off.recomputed_tokens == 0
    assert on.prefill_tokens > off.prefill_tokens


def test_dropped_groups_free_capacity_and_training_continues():
    r = simulate(tiny(**{"workload.drop_rate": 0.3}), 0)
    assert r.rejected.get("zero_variance", 0) > 0
    assert r.trained_trajectories == 6 * 4 * 2


def test_concurrency_below_batch_size_does_not_stall():
    r = simulate(tiny(max_concurrent=1), 2)
    assert r.trained_trajectories == 6 * 4 * 2 and r.staleness_max <= 2


def test_warmup_steps_are_left_out():
    full, tail = simulate(tiny(), 1), simulate(tiny(warmup_steps=2), 1)
    assert tail.steps == 4 and tail.trained_trajectories == 4 * 4 * 2
    assert tail.wall_s < full.wall_s


def test_tool_latency_after_the_last_turn_delays_groups():
    lat = {"workload.tool_latency_s": 0.2}
    assert (
        simulate(tiny(**lat, **{"workload.tool_after_last_turn": True}), 0).wall_s
        > simulate(tiny(**lat), 0).wall_s
    )


def test_modes_colocated_baseline_and_split_search():
    cfg = tiny(**{"cluster.colocated_baseline": True})
    results = run_modes(cfg)
    assert [r.eta for r in results] == [0, 1, 3, 0] and results[-1].colocated
    assert results[-1].rollout_gpus == results[-1].trainer_gpus == 4
    assert 0 <= results[-1].gpu_idle <= 1
    assert split_candidates(cfg) == [1, 2, 3]
    search = split_search(cfg)
    assert set(search.best) == {0, 1, 3}
    for eta, rs in search.results.items():
        assert [r.rollout_gpus for r in rs] == [1, 2, 3]
        assert search.best[eta].trajectories_per_s == max(r.trajectories_per_s for r in rs)
    tp = tiny(**{"rollout.gpus_per_server": 2, "cluster.gpus": 8, "cluster.rollout_gpus": 4})
    assert split_candidates(tp) == [2, 4, 6]


# --------------------------------------------------------------------------- property tests


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    eta=st.integers(0, 4),
    order=st.sampled_from(["finished", "admitted"]),
    B=st.integers(1, 4),
    n=st.integers(1, 3),
    concurrent=st.integers(1, 10),
    rollout_gpus=st.integers(1, 3),
    contention=st.sampled_from([0.5, 1.0]),
    latency=st.sampled_from([0.0, 0.03]),
    shared=st.booleans(),
    recompute=st.booleans(),
    kv=st.sampled_from([0, 400]),
    seed=st.integers(0, 1000),
)
def test_random_settings_keep_the_bound_and_conserve_work(
    eta, order, B, n, concurrent, rollout_gpus, contention, latency, shared, recompute, kv, seed
):
    cfg = tiny(
        seed=seed,
        steps=4,
        batch_size=B,
        group_size=n,
        max_concurrent=concurrent,
        batch_order=order,
        **{
            "cluster.rollout_gpus": rollout_gpus,
            "cluster.contention": contention,
            "workload.tool_latency_s": latency,
            "workload.turns_shared_in_group": shared,
            "rollout.recompute_on_update": recompute,
            "rollout.kv_capacity_tokens": kv,
        },
    )
    r = simulate(cfg, eta)
    assert r.staleness_max <= eta  # the bound holds for every trained trajectory
    assert r.trained_trajectories == 4 * B * n
    assert r.engine_tokens >= r.trained_gen_tokens  # nothing trained that was not generated
    assert r.prefill_tokens >= r.train_tokens - r.trained_gen_tokens - r.recomputed_tokens
    assert r.groups_started >= 4 * B + sum(r.rejected.values())  # every admitted group is accounted for
    assert 0 <= r.rollout_idle <= 1 and 0 <= r.trainer_idle <= 1
    assert r.rollout_wait_s + r.train_s + r.weight_sync_s <= r.wall_s * (1 + 1e-9)
    if eta == 0:
        assert r.rejected.get("stale", 0) == 0 and r.engine_tokens == r.trained_gen_tokens
