"""`asearch train ... launcher=ray` on a real local Ray cluster (`ray start --head --num-cpus 2`): rollout
servers and 2 FSDP trainer ranks as actors. The ranks' update equals the single-process trainer's; a
killed server is relaunched and no group is lost; a resume restores the ranks from the checkpoint; an
allocation the cluster cannot hold is refused with the numbers instead of waiting forever."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray  # a Ray cluster on this machine

torch = pytest.importorskip("torch")
ray = pytest.importorskip("ray")

from asearch.net import free_port  # noqa: E402

B, N, ETA = 2, 2, 2
RAY_BIN = str(Path(sys.executable).parent / "ray")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory, subprocess_env):
    """A head node on 127.0.0.1 with 2 CPUs; yields its address; `ray stop` at the end."""
    port = free_port()
    env = {**subprocess_env, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    t0 = time.monotonic()
    subprocess.run(
        [RAY_BIN, "start", "--head", "--num-cpus=2", "--num-gpus=0", f"--port={port}",
         "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--disable-usage-stats"],
        env=env, check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    print(f"\n[ray] head up in {time.monotonic() - t0:.1f}s at 127.0.0.1:{port}")
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        # a test that failed with this process still connected would otherwise be ended by Ray a minute after
        # `ray stop` (exit 1, the suite's report lost), in whichever later test is running then
        if ray.is_initialized():
            ray.shutdown()
        subprocess.run([RAY_BIN, "stop", "--force"], env=env, capture_output=True, timeout=120)


@pytest.fixture
def ray_cluster(ray_head, monkeypatch):
    """The head node once all its CPUs are free: an earlier test's killed actors hand theirs back asynchronously.
    This process joins it without a token, as the tests' own drivers do."""
    address, env = ray_head
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(address=address, log_to_driver=False, logging_level="warning")
    try:
        t0 = time.monotonic()
        while (free := ray.available_resources().get("CPU", 0.0)) < 2:
            assert time.monotonic() - t0 < 60, f"the Ray cluster still has only {free:g} of 2 CPUs free after 60 s"
            time.sleep(0.1)
        print(f"\n[ray] 2 CPUs free after {time.monotonic() - t0:.1f}s")
    finally:
        ray.shutdown()
    return address, env


def ray_args(address: str, servers: int, ranks: int) -> list[str]:
    return [
        "launcher=ray", f"allocation.ray_address={address}", f"allocation.rollout_servers={servers}",
        "allocation.server_threads=1", f"allocation.trainer_ranks={ranks}",
        "allocation.server_cpus=0.5", "allocation.rank_cpus=0.5",
    ]  # fmt: skip


def test_two_ranks_update_like_one_process(ray_cluster, tiny_world_model_dir) -> None:
    """Two FSDP ranks as Ray actors take the same step as `PolicyTrainer` in this process."""
    from asearch.engine.remote.pool import RolloutServersConfig
    from asearch.launch.ray import RayAllocation, RayLauncher
    from asearch.models.loading import load_model
    from asearch.rl.distributed import _random_samples
    from asearch.rl.trainer import PolicyTrainer, TrainerConfig

    address, env = ray_cluster
    alloc = RayAllocation(
        rollout_servers=1, trainer_ranks=2, rank_cpus=0.5, server_cpus=0.5, ray_address=address
    )
    cfg = TrainerConfig(token_budget=512)
    model = load_model(str(tiny_world_model_dir))
    samples = _random_samples(model.config.vocab_size, 8, 96, seed=3)
    launcher = RayLauncher(str(tiny_world_model_dir), alloc, RolloutServersConfig(), log_dir=Path("unused"))
    try:
        launcher.connect()
        group = launcher.trainer(cfg, temperature=1.0, total_steps=2)
        stats = [group.train_step(samples, policy_version=v) for v in range(2)]
        remote = group.state_dict()["model"]
    finally:
        launcher.stop()
    assert not ray.is_initialized()

    torch.manual_seed(0)
    local = PolicyTrainer(model, cfg, temperature=1.0, total_steps=2)
    local_stats = [local.train_step(samples, policy_version=v) for v in range(2)]
    for s, ls in zip(
        stats, local_stats, strict=True
    ):  # (loss stats are each rank's share; the norm is global)
        assert s["perf/grad_norm"] == pytest.approx(ls["perf/grad_norm"], rel=1e-4)
    start, moved = load_model(str(tiny_world_model_dir)).state_dict(), 0.0
    for name, p in local.model.state_dict().items():
        torch.testing.assert_close(remote[name], p, atol=2e-5, rtol=1e-4, msg=name)
        moved = max(moved, float((p - start[name]).abs().max()))
    assert moved > 1e-4  # the step really changed the weights


def test_an_allocation_larger_than_the_cluster_is_refused(ray_cluster) -> None:
    from asearch.engine.remote.pool import RolloutServersConfig
    from asearch.errors import LaunchError
    from asearch.launch.ray import RayAllocation, RayLauncher

    address, _ = ray_cluster
    alloc = RayAllocation(rollout_servers=2, server_threads=1, trainer_ranks=2, ray_address=address)
    launcher = RayLauncher("unused", alloc, RolloutServersConfig(), log_dir=Path("unused"), trainer_threads=1)
    try:
        with pytest.raises(LaunchError, match=r"needs 4 CPU \(the cluster has 2 free\)"):
            launcher.connect()
    finally:
        launcher.stop()


def test_train_on_ray_survives_a_killed_server_and_resumes(
    train_run, ray_cluster, tiny_world_model_dir, train_command, tmp_path
) -> None:
    address, env = ray_cluster
    out = tmp_path / "run"
    cmd = [
        *train_command(tiny_world_model_dir, out, 100_000, batch=B, group=N, eta=ETA),
        *ray_args(address, 2, 2),
    ]
    cmd += ["max_rl_seconds=30"]  # long enough for the killed server to come back and serve again
    with train_run(cmd, env, out, tmp_path / "train.log") as run:
        run.wait_for_step(2, timeout=150)
        killed_at_step = run.kill_server(0)  # the server process its actor supervises
        run.proc.wait(timeout=180)
    said = run.output()
    assert run.proc.returncode == 0, said[-3000:]
    print(f"ray: killed server 0 after step {killed_at_step}; run took {time.monotonic() - run.t0:.1f}s")
    assert "2 trainer rank(s) ready" in said

    summary = json.loads((out / "summary.json").read_text())
    s0, s1 = summary["rollout_servers"]
    assert s0["restarts"] == 1 and s0["failures"] >= 1, s0
    assert s0["up"] and s0["version"] == s1["version"] == summary["policy_version"], summary[
        "rollout_servers"
    ]
    assert "launch #2" in (out / "logs" / "rollout-0.log").read_text()
    assert "error" not in summary["rejected_groups"] and summary["episode_errors"] == [], summary
    logged = train_run.metrics(out)
    assert [r["step"] for r in logged] == list(range(1, summary["steps"] + 1))
    assert summary["steps"] > killed_at_step
    assert max(r["rollout/staleness_max"] for r in logged) <= ETA
    for s in json.loads((out / "logs" / "servers.json").read_text()):
        with pytest.raises(ProcessLookupError):
            os.kill(s["pid"], 0)  # stopped with the run

    # resume: the ranks load the checkpoint, the servers get its weights, the step count goes on
    steps = summary["steps"]
    ckpt_step = max(int(p.name.split("_")[1]) for p in (out / "checkpoints").glob("step_*"))
    more = [
        *train_command(tiny_world_model_dir, out, ckpt_step + 2, batch=B, group=N, eta=ETA),
        *ray_args(address, 1, 2),
    ]
    done = subprocess.run(more, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"(step {ckpt_step}," in (done.stdout + done.stderr).replace("\n", "")
    assert [r["step"] for r in train_run.metrics(out)] == list(range(1, ckpt_step + 3)), (steps, ckpt_step)
