"""Checkpoints and resume (`asearch.rl.checkpoint`) through `asearch train` in a real subprocess: kill -9, then
resume. Nothing is trained twice, nothing is lost, the staleness accounting and the bound survive the restart."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.server  # `asearch train` in a subprocess, killed and resumed

B, N, ETA = 2, 2, 2
HELDOUT = ["heldout.dataset=world:seed=1,entities=200,n=6", "heldout.every_s=null", "heldout.every_steps=null"]


def test_kill_9_then_resume_trains_every_step_once_and_loses_nothing(
    tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    out = tmp_path / "run"
    # 1. a run that would go on for long; killed with SIGKILL once its second checkpoint exists
    proc = subprocess.Popen(
        [*train_command(tiny_world_model_dir, out, 1000, batch=B, group=N, eta=ETA), *HELDOUT],
        env=subprocess_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 300
    try:
        while not (out / "checkpoints" / "step_4" / "state.json").exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint step_4 in 300 s"
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    steps_before_kill = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]
    ckpts = sorted(
        int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*") if (p / "state.json").exists()
    )
    resume_from = ckpts[-1]
    assert 4 <= resume_from < 10, ckpts

    # 2. the same command (10 steps now) resumes from the last checkpoint and finishes
    done = subprocess.run(
        [*train_command(tiny_world_model_dir, out, 10, batch=B, group=N, eta=ETA), *HELDOUT],
        env=subprocess_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = (done.stdout + done.stderr).replace("\n", "")
    assert "resumed from" in said and f"step_{resume_from} (step {resume_from}," in said, said[-2000:]

    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in logged if "eval/heldout_acc" not in r]
    evals = [r for r in logged if "eval/heldout_acc" in r]
    steps = [r["step"] for r in rows]
    assert steps == list(range(1, 11)), f"before kill {steps_before_kill}, after resume {steps}"
    # the wall clock continues across the restart instead of starting again at 0
    assert all(a["wall_s"] <= b["wall_s"] for a, b in zip(rows, rows[1:], strict=False))
    # the staleness bound held in every trained batch, before and after the kill
    assert max(r["rollout/staleness_max"] for r in rows) <= ETA
    # the in-process engine's work per step is in every row (a step may find its batch already generated)
    assert all(r["engine/requests_finished"] >= 0 for r in rows)
    assert sum(r["engine/tokens_generated"] for r in rows) >= 10 * B * N  # every trained episode generated >= 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 10 and summary["policy_version"] == 10
    # the start's evaluation ran before the kill; the resumed process's summary still reports it
    assert [r["step"] for r in evals] == [0, 10]
    assert summary["heldout_acc_start"] == evals[0]["eval/heldout_acc"] is not None
    assert summary["heldout_acc_final"] == evals[1]["eval/heldout_acc"]

    # 3. the accounting at the end: every question taken from the data stream was trained, rejected, is
    # queued or will be redone; the admission counter is exactly v * B + queued (not reset by the restart)
    state = json.loads((out / "checkpoints" / "step_10" / "state.json").read_text())
    ctl = state["controller"]
    assert ctl["staleness"]["version"] == 10
    assert ctl["staleness"]["accepted"] == 10 * B + len(ctl["ready"])
    assert ctl["data_position"] == 10 * B + sum(ctl["rejected"].values()) + len(ctl["ready"]) + len(
        ctl["redo"]
    )
    # every logged trajectory (one group per step) has its n samples and a reward
    trajs = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert sorted({t["step"] for t in trajs}) == list(range(1, 11))
    assert all(t["reward"] is not None for t in trajs) and len(trajs) == 10 * N


def test_the_time_budget_holds_when_every_group_is_rejected(
    tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    """A random policy earns reward 0 everywhere, so every group has zero variance and is dropped: no batch
    ever forms. The run must still stop at max_rl_seconds (it used to wait for a batch forever)."""
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 100), "rollout.drop_zero_variance=true", "max_rl_seconds=4"]
    started = time.monotonic()
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    said = (done.stdout + done.stderr).replace("\n", " ")
    assert "spent waiting for a batch" in said and "zero_variance" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 0 and summary["rejected_groups"]["zero_variance"] > 0
    assert summary["rl_wall_seconds"] < 30 and time.monotonic() - started < 200


def test_a_run_stopped_by_its_time_budget_checkpoints_its_last_step(
    tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    """Between checkpoints (every 100,000 steps here) the time budget ends the run: its last step is still saved."""
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 100_000), "max_rl_seconds=5", "checkpoint_every=100000"]
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert 0 < steps < 100_000
    saved = [p.name for p in (out / "checkpoints").glob("step_*") if (p / "state.json").exists()]
    assert saved == [f"step_{steps}"]


def test_held_out_evaluations_measure_one_version_each_and_overlap_training(
    tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    """An evaluation of version v runs beside the next train step; the push of v+1 waits for it, so each
    evaluation row names the one version it measured, logged before the step that replaces it."""
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 4), "heldout.dataset=world:seed=1,entities=200,n=6", "heldout.every_steps=1", "heldout.every_s=null"]
    done = subprocess.run(cmd, env=subprocess_env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/heldout_acc" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3, 4]  # the start, after every step, and the final policy
    order = [(r["step"], "eval" if "eval/heldout_acc" in r else "train") for r in rows]
    for v in range(4):  # eval of v comes before the row of step v + 1 (trained while it ran)
        assert order.index((v, "eval")) < order.index((v + 1, "train"))
    steps = [r for r in rows if "perf/step_s" in r]
    assert all(r["perf/eval_wait_s"] >= 0 and r["perf/weight_sync_s"] >= 0 for r in steps)
    assert all(r["eval/seconds"] > 0 for r in evals)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["heldout_acc_final"] == evals[-1]["eval/heldout_acc"] and "heldout_acc_start" in summary
