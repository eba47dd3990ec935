"""Placement that follows the hardware: GPU reservations and bind from what the cluster reports, the
environment forwarded to actors, the trainer ranks' layout and FSDP mesh, the local launcher's GPU split; and
on a real one-node Ray cluster that declares 3 GPUs it does not have (CPU forced): placement groups, each
actor's own CUDA_VISIBLE_DEVICES, the forwarded environment, and ranks built on the meta device."""

from __future__ import annotations

from pathlib import Path

import pytest

from asearch.engine.remote.pool import RolloutServersConfig
from asearch.errors import LaunchError
from asearch.launch.ray import RayAllocation
from asearch.launch.spec import Allocation, forwarded, server_tensor_parallel


def test_gpu_reservations_follow_the_cluster() -> None:
    a = RayAllocation()
    assert a.gpus(cluster_gpus=0) == (0, 0)
    assert a.gpus(cluster_gpus=16, server_tp=2) == (2, 1)  # a server its tensor-parallel size, a rank 1
    explicit = RayAllocation(server_gpus=0, rank_gpus=2)
    assert explicit.gpus(cluster_gpus=16, server_tp=4) == (0, 2)
    assert server_tensor_parallel(RolloutServersConfig()) == 1  # the engine server (kind sglang): one GPU
    assert server_tensor_parallel(RolloutServersConfig(kind="vllm", vllm={"tensor_parallel_size": 2})) == 2
    assert server_tensor_parallel(RolloutServersConfig(kind="sglang-server", sglang={"tp_size": 4})) == 4


def test_bind_auto_is_node_on_a_cluster_of_several_nodes() -> None:
    assert RayAllocation().bind == "auto"
    assert RayAllocation().resolved_bind(alive_nodes=1) == "loopback"
    assert RayAllocation().resolved_bind(alive_nodes=2) == "node"
    assert RayAllocation(bind="loopback").resolved_bind(alive_nodes=3) == "loopback"
    assert RayAllocation(bind="node").resolved_bind(alive_nodes=1) == "node"


def test_actor_environment_is_the_allow_list_plus_allocation_env() -> None:
    environ = {
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "HF_HUB_OFFLINE": "1", "HF_HOME": "/h",
        "TRANSFORMERS_OFFLINE": "1", "ASEARCH_X": "y", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_LAUNCH_BLOCKING": "1",
        "CUDA_VISIBLE_DEVICES": "3",  # Ray sets each actor's own
        "HOME": "/root", "PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "s", "RAY_ADDRESS": "a:1",
    }  # fmt: skip
    env = RayAllocation(env={"NCCL_DEBUG": "INFO", "HF_HOME": "/shared/hf"}).actor_env(environ)
    assert env == {
        "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0", "HF_HUB_OFFLINE": "1", "HF_HOME": "/shared/hf",
        "TRANSFORMERS_OFFLINE": "1", "ASEARCH_X": "y", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_LAUNCH_BLOCKING": "1", "NCCL_DEBUG": "INFO",
    }  # fmt: skip
    assert not forwarded("CUDA_VISIBLE_DEVICES") and not forwarded("PATH") and forwarded("VLLM_USE_V1")


def test_rank_layout_keeps_each_nodes_ranks_together_and_picks_the_mesh() -> None:
    from asearch.launch.ray import bundle, rank_layout

    assert rank_layout(["a", "a"], "auto") == ([0, 1], None)  # one node: 1-D
    assert rank_layout(["a", "b"], "auto") == ([0, 1], (2, 1))  # one rank per node: replicate 2 x shard 1
    # bundle 0 (rank 0, on the chosen node) first; then each node's bundles consecutively
    assert rank_layout(["a", "b", "a", "b"], "auto") == ([0, 2, 1, 3], (2, 2))
    assert rank_layout(["a", "b", "a", "b"], "shard") == ([0, 2, 1, 3], None)
    assert rank_layout(["a", "a", "b"], "auto") == ([0, 1, 2], None)  # uneven: 1-D
    with pytest.raises(LaunchError, match="as many trainer ranks on every node; Ray placed 2, 1"):
        rank_layout(["a", "a", "b"], "hybrid")
    assert rank_layout(["a", "a"], "hybrid") == ([0, 1], (1, 2))
    assert bundle(0.5, 0) == {"CPU": 0.5} and bundle(1, 2) == {"CPU": 1, "GPU": 2}


def test_local_launcher_gives_servers_and_trainer_disjoint_gpus(monkeypatch, tmp_path) -> None:
    from asearch.launch import local
    from asearch.rl.trainer import TrainerConfig

    assert local.split_gpus([], 2, 1) == ([], [])
    assert local.split_gpus(["0", "1", "2", "3"], 2, 1) == ([["0"], ["1"]], ["2", "3"])
    assert local.split_gpus(["4", "5", "6", "7", "8"], 2, 2) == ([["4", "5"], ["6", "7"]], ["8"])
    assert local.split_gpus(["0"], 1, 1) == ([["0"]], ["0"])  # one GPU: shared (logged)

    said: list[str] = []
    monkeypatch.setattr(local, "visible_gpus", lambda: ["0", "1", "2"])
    launcher = local.LocalLauncher(
        "unused", Allocation(rollout_servers=2), RolloutServersConfig(), log_dir=tmp_path, log=said.append
    )
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in launcher.supervisors] == ["0", "1"]  # each server process
    set_to: list[int] = []
    monkeypatch.setattr("torch.cuda.set_device", set_to.append)
    assert launcher.trainer(TrainerConfig(), temperature=1.0, total_steps=1) is None  # trains in this process
    assert set_to == [2]  # trainer.device auto -> cuda:2, the GPU no server has
    assert said == ["local launcher: GPUs 0, 1 for the rollout servers, 2 for the trainer"]


def test_servers_context_follows_the_agent_budget() -> None:
    from asearch.launch.train import TrainConfig

    cfg = TrainConfig(model="m", data="d", launcher="local", agent={"max_context_tokens": 20_000})
    assert cfg.engine.options.max_seq_len == 20_000  # vLLM --max-model-len / engine server --max-seq-len
    assert TrainConfig(model="m", data="d").engine.options.max_seq_len == 2048  # in-process engine: unchanged
    with pytest.raises(Exception, match=r"engine.max_seq_len=1024 .* agent.max_context_tokens=20000"):
        TrainConfig(
            model="m", data="d", launcher="local", engine={"max_seq_len": 1024}, agent={"max_context_tokens": 20_000}
        )


# ---------------------------------------------------------------------------- a real Ray cluster, GPUs declared


@pytest.fixture
def ray_with_declared_gpus(monkeypatch):
    """A one-node Ray cluster of this process with 2 CPUs and 3 GPUs it does not have; the CPU device is forced
    (the CPU torch build has no CUDA, and on a GPU machine the ranks train with trainer.device=cpu)."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("ASEARCH_PLACEMENT_PROBE", "forwarded")
    ray.init(address="local", num_cpus=2, num_gpus=3, include_dashboard=False, log_to_driver=False, logging_level="warning")
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.ray
def test_ranks_and_server_get_their_own_declared_gpus(ray_with_declared_gpus, tiny_world_model_dir) -> None:
    """1 server and 2 trainer ranks on a cluster with 3 (declared) GPUs: each reserves 1 (auto), sees its own id,
    gets the forwarded environment; rank 1 starts on the meta device and holds rank 0's weights after setup."""
    import torch

    from asearch.launch.ray import RayLauncher
    from asearch.models.loading import load_model
    from asearch.rl.trainer import TrainerConfig

    ray = ray_with_declared_gpus

    def actor_view(actor):  # nested: pickled by value (the workers cannot import this test module)
        import os

        return {
            "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "probe": os.environ.get("ASEARCH_PLACEMENT_PROBE"),
            "device": actor.trainer.env.device.type,
        }  # fmt: skip

    said: list[str] = []
    alloc = RayAllocation(rollout_servers=1, trainer_ranks=2, server_cpus=0.5, rank_cpus=0.5)
    launcher = RayLauncher(str(tiny_world_model_dir), alloc, RolloutServersConfig(), log_dir=Path("unused"), log=said.append)
    try:
        launcher.connect()
        assert (launcher.server_gpus, launcher.rank_gpus, launcher.bind) == (1.0, 1.0, "loopback")
        assert launcher.mesh_shape is None  # one node: 1-D
        assert ray.available_resources().get("GPU", 0) == 0  # all 3 reserved by the placement groups
        group = launcher.trainer(TrainerConfig(device="cpu"), temperature=1.0, total_steps=1)
        seen = ray.get([r.__ray_call__.remote(actor_view) for r in group.ranks])
        gathered = group.state_dict()["model"]
    finally:
        launcher.stop()
    print("\n" + "\n".join(said))
    gpus = [s["cuda"] for s in seen]
    assert all(len(g) == 1 for g in gpus) and len(set(gpus)) == 2, gpus  # one GPU each, not the same one
    assert [s["probe"] for s in seen] == ["forwarded", "forwarded"]  # (a variable off the list reaches them too
    # here, through this process's raylet: tests/launch/test_two_nodes.py checks that on nodes started apart)
    assert [s["device"] for s in seen] == ["cpu", "cpu"]
    assert any(line.startswith("ray launcher: trainer rank 1 on node ") and f"GPUs {gpus[1]} " in line for line in said), said
    assert "forwarded to actors: ASEARCH_PLACEMENT_PROBE" in "\n".join(said)
    for name, p in load_model(str(tiny_world_model_dir)).state_dict().items():
        torch.testing.assert_close(gathered[name], p, msg=name)  # rank 1's shards came from rank 0

