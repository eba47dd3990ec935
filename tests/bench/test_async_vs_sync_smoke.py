"""Smoke test of bench/async_vs_sync.py: the real script at tiny size, its table and its numbers' sanity."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "async_vs_sync.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("async_vs_sync_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_turn_counts_are_heavy_tailed_with_a_30x_spread():
    bench = _bench_module()
    turns = bench.heavy_tailed_turns(20_000, low=2, high=60, alpha=1.0, seed=3)
    assert min(turns) == 2 and max(turns) == 60
    # Pareto(1) with scale 2: P(k >= 30) = 2/30; most questions are short
    assert sum(k >= 30 for k in turns) / len(turns) == pytest.approx(2 / 30, abs=0.01)
    assert sum(k <= 3 for k in turns) / len(turns) > 0.3
    assert turns == bench.heavy_tailed_turns(20_000, low=2, high=60, alpha=1.0, seed=3)  # seeded


def test_heavy_tailed_latency_has_the_asked_median_and_p99_and_the_same_draw_per_turn():
    bench = _bench_module()
    lat = bench.EnvLatency(None, 0.2, p99_s=2.0, seed=0)
    waits = sorted(lat.wait_s(f"q{i}") for i in range(20_000))
    assert waits[10_000] == pytest.approx(0.2, rel=0.05)
    assert waits[19_800] == pytest.approx(2.0, rel=0.1)
    a, b = (bench.EnvLatency(None, 0.2, p99_s=2.0, seed=0) for _ in range(2))  # two settings
    waits_a = [a.wait_s("q7") for _ in range(3)]
    assert waits_a == [b.wait_s("q7") for _ in range(3)] and len(set(waits_a)) == 3  # per turn, same in both
    assert bench.EnvLatency(None, 0.2).wait_s("q1") == 0.2  # fixed without a p99
    with pytest.raises(SystemExit):
        bench.parse_args(["--env-latency-ms", "200", "--env-latency-p99-ms", "100"])


def test_parse_args_rejects_a_run_without_baseline_or_async_setting():
    bench = _bench_module()
    with pytest.raises(SystemExit):
        bench.parse_args(["--etas", "1,2"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--etas", "0,1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--group", "1"])


def test_quick_run_prints_the_table_and_sane_numbers(tmp_path):
    out_json = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--json", str(out_json)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()

    # the table: one row per setting, in order
    rows = [ln for ln in lines if re.match(r"\| (synchronous|one-step-off|fully async) \|", ln)]
    assert [r.split("|")[2].strip() for r in rows] == ["0", "1", "2", "4"]

    data = json.loads(out_json.read_text())
    args, results = data["args"], {r["eta"]: r for r in data["results"]}
    assert sorted(results) == [0, 1, 2, 4]
    expected = args["steps"] * args["batch"] * args["group"]
    for eta, r in results.items():
        assert r["trained_trajectories"] == expected  # same total work: S x B x n in every setting
        assert r["wall_s"] > 0
        assert r["trajectories_per_s"] == pytest.approx(expected / r["wall_s"])
        assert 0.0 <= r["idle_fraction"] <= 1.0
        assert r["staleness_max"] <= eta  # the controller's bound holds for every trained trajectory
        assert r["engine_tokens"] >= r["trained_gen_tokens"] > 0
        assert r["rollout_wait_s"] + r["train_s"] + r["weight_sync_s"] <= r["wall_s"] + 1e-6
        assert 1 <= r["trained_turns_max"] <= args["max_turns"]
        assert r["cut_short"] == 0  # every episode ran its question's k turns: the work is as designed
    sync = results[0]
    assert sync["staleness_max"] == 0 and sync["rejected"] == {}
    assert sync["idle_fraction"] > 0  # synchronous generation waits while the trainer runs
    assert sync["recomputed_tokens"] == 0  # nothing is in flight when weights change

    # synchronous RL trains exactly the first S x B questions, each episode exactly k turns long
    bench = _bench_module()
    n_questions = (args["steps"] + max(args["eta_list"]) + 2) * args["batch"] * 4
    turns = bench.heavy_tailed_turns(
        n_questions, low=args["min_turns"], high=args["max_turns"], alpha=args["alpha"], seed=args["seed"]
    )
    first = turns[: args["steps"] * args["batch"]]
    assert sync["trained_turns_mean"] == pytest.approx(sum(first) / len(first))
    assert sync["long_groups_trained"] == sum(k >= args["long_turns"] for k in first)

    # batch_order=admitted (the default): every setting trains the same groups, so the ratio is equal work
    assert args["batch_order"] == "admitted" and args["engine"] == "server"
    for r in results.values():
        assert r["long_groups_trained"] == sync["long_groups_trained"] and "stale" not in r["rejected"]
        assert r["trained_turns_mean"] == pytest.approx(sync["trained_turns_mean"])
    assert "equal-work check: every setting trained as many long groups as the synchronous run." in lines

    # the last line is the ratio of the best fully asynchronous setting to the synchronous one
    m = re.fullmatch(r"async/sync throughput ratio: (\d+\.\d\d)", lines[-1])
    assert m, lines[-1]
    best = max(results[e]["trajectories_per_s"] for e in results if e >= 2)
    assert float(m.group(1)) == pytest.approx(best / sync["trajectories_per_s"], abs=0.006)
    assert data["async_sync_ratio"] == pytest.approx(best / sync["trajectories_per_s"])
