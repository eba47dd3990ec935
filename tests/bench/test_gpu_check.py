"""bench/gpu_check.py at a tiny shape on the CPU: every phase runs the code the GPU run does, and the table and
JSON hold real, consistent numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_every_phase_at_a_tiny_shape_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shape", "tiny", "--device", "cpu", "--out", str(out),
         "--batches", "1,3", "--prompt", "12", "--new", "6", "--train-len", "48", "--train-samples", "4",
         "--train-steps", "1"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["errors"] == {} and result["env"]["device"] == "cpu" and result["shape"] == "tiny"
    parity = {r["engine_dtype"]: r for r in result["rows"] if r["phase"] == "parity"}
    assert parity["float32"]["max_abs_logprob_diff"] < 1e-3 and parity["float32"]["argmax_agreement"] > 0.9
    assert parity["bfloat16"]["max_abs_logprob_diff"] > parity["float32"]["max_abs_logprob_diff"]
    decode = [r for r in result["rows"] if r["phase"] == "decode"]
    assert [r["batch"] for r in decode] == [1, 3]
    for r in decode:
        assert r["engine_tokens_per_s"] > 0 and r["hf_generate_tokens_per_s"] > 0
        assert abs(r["ratio"] - r["engine_tokens_per_s"] / r["hf_generate_tokens_per_s"]) < 1e-9
    (train,) = [r for r in result["rows"] if r["phase"] == "train"]
    assert train["tokens_per_s"] > 0 and train["mfu"] is None and train["dtype"] == "torch.float32"  # no CPU peak
    (rl,) = [r for r in result["rows"] if r["phase"] == "rl"]
    assert rl["rl_steps"] >= 1 and 0 <= rl["heldout_before"] <= 1 and 0 <= rl["heldout_after"] <= 1
    assert (tmp_path / "rl-demo" / "summary.json").exists()
    (long,) = [r for r in result["rows"] if r["phase"] == "long"]  # issue 16's GPU part: the long preset
    assert long["rl_steps"] >= 1 and long["mean_turns_after"] > 0 and 0 <= long["heldout_after"] <= 1
    assert "\npreset: long\npages: long\n" in (tmp_path / "long-demo" / "config.yaml").read_text()
    assert "| batch | in-process engine tok/s |" in done.stdout and "trainer:" in done.stdout and "async RL (demo" in done.stdout
    assert "async RL (long-horizon preset" in done.stdout
    plan = [r for r in result["rows"] if r["phase"] == "plan"]  # the memory plan against the measured peak
    assert plan and all(r["measured"] > 0 and abs(r["error"]) < 0.2 for r in plan), plan
    weights = {r["method"]: r for r in result["rows"] if r["phase"] == "weights"}  # disk and collective sync
    assert set(weights) == {"disk-float32", "disk-bfloat16", "collective"}
    assert all(r["seconds"] > 0 for r in weights.values()) and weights["collective"]["backend"] == "gloo"
    assert weights["disk-bfloat16"]["gb"] < weights["disk-float32"]["gb"]
    assert "| memory plan: what |" in done.stdout


def test_a_failing_phase_is_reported_and_the_others_kept(tmp_path):
    out = tmp_path / "g.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--shape", "tiny", "--device", "cpu", "--out", str(out),
         "--phases", "decode,train", "--batches", "0", "--train-len", "32", "--train-samples", "2", "--train-steps", "1"],
        env=env, capture_output=True, text=True, timeout=300,  # as the test above: on a loaded 2-core box 120 s ran out
    )  # fmt: skip
    assert done.returncode == 1
    result = json.loads(out.read_text())
    assert [r["phase"] for r in result["rows"]] == ["train"] and "max_batch" in result["errors"]["decode"]
    assert "decode FAILED" in done.stdout
