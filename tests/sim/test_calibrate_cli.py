"""Calibration against bench/async_vs_sync.py JSON, and the `asearch sim` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from asearch.cli.app import app
from asearch.errors import ConfigError
from asearch.sim import simulate
from asearch.sim.calibrate import bench_config, calibrate, fit, format_calibration, load_bench, load_probe

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "bench" / "data" / "async_vs_sync"


def test_fit_on_sync_predicts_the_measured_rows_within_20_percent():
    rows = calibrate(MEASURED / "inprocess_admitted.json", replicates=2)
    assert [r["eta"] for r in rows] == [0, 1, 2, 4]
    sync = rows[0]
    assert abs(sync["error"]["trajectories_per_s"]) < 0.01  # the fitted row
    assert sync["predicted"]["trained_turns_mean"] == pytest.approx(sync["measured"]["trained_turns_mean"])
    for r in rows[1:]:
        assert abs(r["error"]["trajectories_per_s"]) <= 0.2, r
        assert r["predicted"]["staleness_mean"] == pytest.approx(r["measured"]["staleness_mean"], abs=0.1)
    text = format_calibration(rows)
    assert "| inprocess_admitted | 4 |" in text and "within 20%" in text


def test_calibration_recovers_a_simulated_bench(tmp_path):
    """A bench JSON written by the simulator itself is predicted almost exactly: the fit is consistent."""
    data, rows = load_bench(MEASURED / "inprocess_finished.json")
    cfg = fit(bench_config(data, rows[0], load_probe(None)), rows[0])
    fake = []
    for eta in (0, 1, 2):
        r = simulate(cfg, eta)
        fake.append({"eta": eta, "wall_s": r.wall_s, "train_s": r.train_s, "rollout_wait_s": r.rollout_wait_s,
                     "trained_trajectories": r.trained_trajectories, "train_tokens": r.train_tokens,
                     "trained_gen_tokens": r.trained_gen_tokens, "trained_turns_mean": r.trained_turns_mean,
                     "weight_sync_s": r.weight_sync_s, "cores_used": 0.5})  # fmt: skip
    path = tmp_path / "fake.json"
    path.write_text(
        json.dumps({"args": {**data["args"], "etas": "0,1,2", "eta_list": [0, 1, 2]}, "results": fake})
    )
    for row in calibrate(path, replicates=1, probe_file=None):
        assert abs(row["error"]["trajectories_per_s"]) < 0.05, row


def test_bench_json_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"results": []}))
    with pytest.raises(ConfigError, match="non-empty 'results'"):
        load_bench(bad)
    bad.write_text(json.dumps({"args": {"batch": 2, "group": 2, "steps": 1}, "results": [{"eta": 1}]}))
    with pytest.raises(ConfigError, match="no synchronous"):
        load_bench(bad)
    bad.write_text(
        json.dumps({"args": {"batch": 2, "group": 2, "steps": 1}, "results": [{"eta": 0, "wall_s": 1}]})
    )
    with pytest.raises(ConfigError, match="missing 'train_s'"):
        load_bench(bad)
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_bench(bad)


TINY = """
steps: 3
batch_size: 2
group_size: 2
max_concurrent: 4
etas: [0, 2]
cluster: {gpus: 4, rollout_gpus: 2, colocated_baseline: true}
rollout: {decode_base_s: 0.002, decode_per_row_s: 0.0001, kv_read_s_per_token: 0.0, prefill_s_per_token: 0.00001}
trainer: {tokens_per_s_per_gpu: 5000, step_overhead_s: 0.0, weight_sync_s: 0.01}
workload:
  turns: {kind: pareto, min: 1, max: 20, alpha: 1.0, integer: true}
  prompt_tokens: 20
  obs_tokens: 30
  gen_tokens: {kind: lognormal, mean: 15, cv: 0.5, integer: true}
split: {step_gpus: 1, steps: 2}
"""


def test_cli_runs_modes_and_split_search(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    out = tmp_path / "out.json"
    res = CliRunner().invoke(app, ["sim", str(cfg), "seed=3", "--json", str(out)])
    assert res.exit_code == 0, res.output
    for text in ("synchronous", "fully async", "colocated", "best split for eta=2", "GPU idle"):
        assert text in res.output
    record = json.loads(out.read_text())
    assert record["config"]["seed"] == 3
    assert [m["eta"] for m in record["modes"]] == [0, 2, 0]
    assert set(record["split"]) == {"0", "2"} and len(record["split"]["2"]) == 3
    res = CliRunner().invoke(app, ["sim", str(cfg), "--no-split"])
    assert res.exit_code == 0 and "best split" not in res.output


def test_cli_calibrate_and_errors(tmp_path):
    res = CliRunner().invoke(app, ["sim", "--calibrate", str(MEASURED / "inprocess_admitted.json")])
    assert res.exit_code == 0, res.output
    assert "| inprocess_admitted | 2 |" in res.output and "within 20%" in res.output
    res = CliRunner().invoke(app, ["sim"])
    assert isinstance(res.exception, ConfigError)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("cluster: {gpus: 4, rollout_gpus: 9}\n")
    res = CliRunner().invoke(app, ["sim", str(cfg)])
    assert isinstance(res.exception, ConfigError) and "bad.yaml" in str(res.exception)


def test_bench_script_writes_nothing_with_no_save(capsys):
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(
        "sim_calibration_bench", ROOT / "bench" / "sim_calibration.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    assert mod.main([str(MEASURED / "server_admitted_2.json"), "--no-save", "--replicates", "1"]) == 0
    out = capsys.readouterr().out
    assert "| server_admitted_2 | 4 |" in out and "predicted rows" in out
