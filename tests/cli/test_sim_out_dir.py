"""`asearch sim --out DIR` keeps what it printed (report.txt), the results, the figure and the resolved config."""

from __future__ import annotations

import json
import subprocess
import sys

from asearch.config import load_config
from asearch.sim.config import SimConfig

TINY = """
steps: 3
batch_size: 2
group_size: 2
max_concurrent: 4
etas: [0, 2]
cluster: {gpus: 4, rollout_gpus: 2}
rollout: {decode_base_s: 0.002, decode_per_row_s: 0.0001, kv_read_s_per_token: 0.0, prefill_s_per_token: 0.00001}
trainer: {tokens_per_s_per_gpu: 5000, step_overhead_s: 0.0, weight_sync_s: 0.01}
workload:
  turns: {kind: pareto, min: 1, max: 8, alpha: 1.0, integer: true}
  prompt_tokens: 20
  obs_tokens: 30
  gen_tokens: {kind: lognormal, mean: 15, cv: 0.5, integer: true}
split: {step_gpus: 1, steps: 2}
"""


def test_sim_out_writes_report_results_plot_and_config(tmp_path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = tmp_path / "runs" / "sim"
    res = subprocess.run(
        [sys.executable, "-m", "asearch", "sim", str(config), "seed=5", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "plot.png", "report.txt", "results.json"]
    assert (out / "report.txt").read_text() == res.stdout  # the tables exactly as printed
    assert "best split for eta=2" in res.stdout
    assert json.loads((out / "results.json").read_text())["config"]["seed"] == 5
    assert load_config(SimConfig, out / "config.yaml").seed == 5
    assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"
