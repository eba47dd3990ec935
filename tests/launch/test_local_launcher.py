"""`asearch train ... launcher=local`: generation on 2 rollout servers started as subprocesses (1 torch
thread each), weights pushed through disk after every step; a killed server is relaunched, takes the
latest weights and rejoins, while its requests move to the other server and no group is lost."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.server  # rollout servers started by launcher=local

B, N, ETA = 2, 2, 2
LOCAL = ["launcher=local", "allocation.rollout_servers=2", "allocation.server_threads=1"]


def loaded_versions(log: str) -> list[int]:
    """Versions a server's log says it loaded, in order (asearch.engine.server.app logs each update)."""
    return [int(v) for v in re.findall(r"loaded weights \S+ as weight_version (\d+)", log)]


def assert_stopped(out: Path) -> None:
    for s in json.loads((out / "logs" / "servers.json").read_text()):
        with pytest.raises(ProcessLookupError):
            os.kill(s["pid"], 0)


def train(model: Path, out: Path, steps: int, train_command, env) -> str:
    t0 = time.monotonic()
    done = subprocess.run(
        [*train_command(model, out, steps, batch=B, group=N, eta=ETA), *LOCAL],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(f"asearch train to step {steps} on 2 local servers: {time.monotonic() - t0:.1f}s")
    return done.stdout + done.stderr


def test_train_on_two_local_servers_then_resume(
    train_run, tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    out, steps = tmp_path / "run", 4
    train(tiny_world_model_dir, out, steps, train_command, subprocess_env)

    # every step logged with rollout, loss and timing metrics, the staleness bound held
    logged = train_run.metrics(out)
    assert [r["step"] for r in logged] == list(range(1, steps + 1))
    for key in ("rollout/reward_mean", "loss/policy", "perf/train_s", "perf/weight_sync_s", "perf/step_s"):
        assert all(r.get(key) is not None for r in logged), key
    assert max(r["rollout/staleness_max"] for r in logged) <= ETA

    # both servers answered requests and loaded every version: the trainer's start weights (0), then 1..4
    summary = json.loads((out / "summary.json").read_text())
    servers = summary["rollout_servers"]
    assert len(servers) == 2 and all(s["served"] > 0 for s in servers), servers
    assert all(s["version"] == steps and s["weight_updates"] == steps + 1 for s in servers), servers
    for i in range(2):
        assert loaded_versions((out / "logs" / f"rollout-{i}.log").read_text()) == list(range(steps + 1))
    # weights go over the weight group (the default): none touches the disk
    assert all(r["weights/collective"] == 1.0 for r in logged), [r.get("weights/collective") for r in logged]
    assert not any((out / "weights").glob("v*"))
    # every token of a logged trajectory carries a version the servers really had
    for t in map(json.loads, (out / "trajectories.jsonl").read_text().splitlines()):
        versions = {
            v for seg in t["segments"] for v, m in zip(seg["versions"], seg["loss_mask"], strict=True) if m
        }
        assert versions and all(t["step"] - 1 - ETA <= v <= t["step"] - 1 for v in versions), (
            t["step"],
            versions,
        )
    assert_stopped(out)

    # the same command to step 6 resumes from the step-4 checkpoint: new servers get its weights first
    said = train(tiny_world_model_dir, out, 6, train_command, subprocess_env).replace("\n", "")
    assert "resumed from" in said and "(step 4," in said, said[-2000:]
    assert [r["step"] for r in train_run.metrics(out)] == list(range(1, 7))
    for i in range(2):
        second_launch = (out / "logs" / f"rollout-{i}.log").read_text().split("launch #1")[-1]
        assert loaded_versions(second_launch) == [4, 5, 6]
    assert not any((out / "weights").glob("v*"))
    assert_stopped(out)


def test_a_killed_server_is_relaunched_and_no_group_is_lost(
    train_run, tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 100_000, batch=B, group=N, eta=ETA), *LOCAL]
    # stopped by its RL time limit; long enough for the killed server to come back and train with both
    cmd += ["max_rl_seconds=25"]
    with train_run(cmd, subprocess_env, out, tmp_path / "train.log") as run:
        run.wait_for_step(2, timeout=90)  # training is under way: both servers have requests in flight
        killed_at_step = run.kill_server(0)
        run.proc.wait(timeout=120)
    assert run.proc.returncode == 0, run.output()[-3000:]
    print(f"killed server 0 after step {killed_at_step}; run took {time.monotonic() - run.t0:.1f}s")

    # the supervisor relaunched it; the pool moved its requests, then gave it the latest weights
    summary = json.loads((out / "summary.json").read_text())
    s0, s1 = summary["rollout_servers"]
    assert s0["restarts"] == 1 and s0["failures"] >= 1, s0
    assert s0["up"] and s0["version"] == s1["version"] == summary["policy_version"], summary[
        "rollout_servers"
    ]
    log0 = (out / "logs" / "rollout-0.log").read_text()
    assert "launch #2" in log0
    after = loaded_versions(log0.split("launch #2")[1])
    assert after and after[0] >= killed_at_step and after[-1] == summary["policy_version"], after
    assert json.loads((out / "logs" / "servers.json").read_text())[0]["restarts"] == 1

    # no group was lost: no episode failed, every step trained B groups within the bound, and every question
    # taken from the data is trained, rejected by a named cause, queued or in flight at the checkpoint
    assert "error" not in summary["rejected_groups"] and summary["episode_errors"] == [], summary
    logged = train_run.metrics(out)
    assert [r["step"] for r in logged] == list(range(1, summary["steps"] + 1))
    assert summary["steps"] > killed_at_step + 2
    assert max(r["rollout/staleness_max"] for r in logged) <= ETA
    ckpt = max((out / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    state = json.loads((ckpt / "state.json").read_text())
    ctl = state["controller"]
    assert ctl["data_position"] == state["step"] * B + sum(ctl["rejected"].values()) + len(
        ctl["ready"]
    ) + len(ctl["redo"])
    assert_stopped(out)


def test_ctrl_c_stops_the_servers(
    train_run, tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 100_000, batch=B, group=N, eta=ETA), *LOCAL]
    with train_run(cmd, subprocess_env, out) as run:
        run.wait_for_step(1, timeout=90)
        run.proc.send_signal(signal.SIGINT)
        run.proc.wait(timeout=60)
    assert_stopped(out)  # the servers run in their own sessions: Ctrl-C reaches them through the launcher


def test_servers_exit_when_the_trainer_is_killed(
    train_run, tiny_world_model_dir, train_command, subprocess_env, tmp_path
) -> None:
    """SIGKILL leaves the launcher no chance to stop anything: the servers notice their parent is gone."""
    out = tmp_path / "run"
    cmd = [*train_command(tiny_world_model_dir, out, 100_000, batch=B, group=N, eta=ETA), *LOCAL]
    with train_run(cmd, subprocess_env, out) as run:
        run.wait_for_step(1, timeout=90)
    # (leaving the block SIGKILLs the trainer)
    pids = [s["pid"] for s in json.loads((out / "logs" / "servers.json").read_text())]
    killed = time.monotonic()
    while time.monotonic() - killed < 30:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            break
        time.sleep(0.2)
    assert not alive, f"servers {alive} still running 30 s after the trainer was killed"
    print(f"both servers exited {time.monotonic() - killed:.1f}s after the trainer's SIGKILL")
    log = (out / "logs" / "rollout-0.log").read_text()
    assert "is gone: shutting down" in log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by init) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
