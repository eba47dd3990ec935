"""The Ray launcher (`launcher=ray`): rollout servers and FSDP trainer ranks as actors on a Ray cluster.

    ray start --head --num-cpus 8            # once per cluster (other nodes: ray start --address HEAD:6379)
    asearch train CONFIG launcher=ray allocation.rollout_servers=4 allocation.trainer_ranks=4

Each rollout server is one actor that reserves `server_cpus`/`server_gpus` and supervises its server
process on its node (health checks, relaunch on a crash, log at RUN/logs/rollout-<i>.log); the run's
`EnginePool` routes trajectories to the servers and moves a failed server's requests to the others, so a
crash loses no group. The trainer is `trainer_ranks` actors running `DistributedPolicyTrainer` (FSDP2:
gloo on CPU, NCCL on GPU) in one process group; this process (controller and agents) sends each batch to
every rank and rank 0 writes the weights the servers load (RUN must be on a filesystem every node sees).

Before placing anything the launcher checks that the cluster has the CPUs and GPUs the allocation asks
for: Ray would otherwise wait forever for an actor it cannot place. GPU reservations and addresses follow
the cluster (a rank 1 GPU, a server its tensor-parallel size; node IPs once there are several nodes); the
servers are spread over the nodes and the ranks packed, rank 0 on `allocation.rank0_node`, in placement
groups; ranks across nodes shard within a node and replicate across (HSDP). docs/cluster.md has the rules.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.remote.pool import RolloutServersConfig
from asearch.engine.supervisor import SupervisorConfig
from asearch.errors import LaunchError, TrainerRankError
from asearch.launch.registry import register_launcher
from asearch.launch.spec import Allocation, Launcher, forwarded, server_tensor_parallel


class RayAllocation(Allocation):
    """The Ray launcher's options: the common allocation plus where and how its actors are placed (the keys stay
    `allocation.ray_address`, `allocation.server_gpus`, ...)."""

    ray_address: str | None = Field(
        None,
        description="The cluster to join (host:port of `ray start --head`); None: the "
        "RAY_ADDRESS variable, else the cluster started on this machine.",
    )
    server_cpus: float | None = Field(
        None, gt=0, description="CPUs each server actor reserves (default server_threads)."
    )
    rank_cpus: float | None = Field(
        None, gt=0, description="CPUs each trainer rank reserves (default: the run's threads)."
    )
    server_gpus: float | None = Field(
        None, ge=0, description="GPUs each rollout server reserves; None: its tensor-parallel size "
        "when the cluster has GPUs, else 0 (an explicit 0 on a GPU cluster is allowed and logged).",
    )
    rank_gpus: float | None = Field(
        None, ge=0, description="GPUs each trainer rank reserves; None: 1 when the cluster has "
        "GPUs, else 0 (an explicit 0 on a GPU cluster is allowed and logged).",
    )
    bind: Literal["auto", "loopback", "node"] = Field(
        "auto",
        description="Where servers and rank 0's rendezvous store listen and what they advertise: "
        "loopback (127.0.0.1: one machine), node (the node's IP: the trainer reaches them across nodes; keep the "
        "cluster network private), auto (node once the cluster has more than one alive node, else loopback).",
    )
    rank0_node: str = Field(
        "head",
        description="The node trainer rank 0 (the process that writes weights and checkpoints) "
        "is placed on: head, or a node's IP address.",
    )
    fsdp_mesh: Literal["auto", "shard", "hybrid"] = Field(
        "auto",
        description="shard (1-D: parameters sharded over every rank), hybrid (2-D, HSDP: sharded "
        "within a node, replicated across nodes; every node must hold the same number of ranks), auto (hybrid "
        "when the ranks span more than one node and every node holds the same number, else shard).",
    )
    rank_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="How long one call on the trainer ranks (a train step, a save, a weight push) may "
        "take; a rank that has not answered by then, or that failed, stops the run with an error naming it and its "
        "node (the last checkpoint resumes it). Also the ranks' collective timeout (init_process_group).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables set in every actor (and its server process), on top "
        "of the allow-listed ones forwarded from this process (asearch.launch.spec.FORWARDED_ENV).",
    )

    def cpus(self, trainer_threads: int) -> tuple[float, float]:
        """Ray CPU reservations: (per server, per trainer rank)."""
        return (self.server_cpus or float(self.server_threads), self.rank_cpus or float(trainer_threads))

    def gpus(self, cluster_gpus: float, server_tp: int = 1) -> tuple[float, float]:
        """Ray GPU reservations: (per server, per trainer rank). Unset ones follow the hardware: a server its
        tensor-parallel size and a rank 1 GPU when the cluster has any, else 0."""
        has = cluster_gpus > 0
        server = self.server_gpus if self.server_gpus is not None else (float(server_tp) if has else 0.0)
        rank = self.rank_gpus if self.rank_gpus is not None else (1.0 if has else 0.0)
        return server, rank

    def resolved_bind(self, alive_nodes: int) -> Literal["loopback", "node"]:
        """`bind` with auto decided: node addresses once the cluster has more than one node."""
        if self.bind != "auto":
            return self.bind
        return "node" if alive_nodes > 1 else "loopback"

    def actor_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables every actor gets: the allow-listed ones of `environ` (this process's), then `env`."""
        return {k: v for k, v in environ.items() if forwarded(k)} | dict(self.env)


# ---------------------------------------------------------------------------- actors (run on the cluster)


def actor_placement() -> dict[str, Any]:
    """Where Ray placed the calling actor: its node's IP, the GPU ids it reserved, the CUDA devices it sees."""
    import ray

    gpus = [str(g) for g in ray.get_gpu_ids()]
    return {"node": ray.util.get_node_ip_address(), "gpus": gpus, "cuda_visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def gloo_on_node_interface() -> None:
    """Make gloo groups of this process (and of the servers it starts) use the interface of this node's IP. Gloo
    otherwise advertises the address its hostname resolves to, often 127.0.0.1: unreachable from other nodes
    (seen in tests/launch/test_two_nodes.py: 'Connection refused, remote=[127.0.0.1]'). GLOO_SOCKET_IFNAME set
    by the user (allocation.env) wins."""
    import socket

    import psutil
    import ray

    if "GLOO_SOCKET_IFNAME" in os.environ:
        return
    ip = ray.util.get_node_ip_address()
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == ip for a in addrs):
            os.environ["GLOO_SOCKET_IFNAME"] = name
            return


class RolloutServerActor:
    """Supervises one rollout server process on the node Ray placed this actor on."""

    def __init__(self, model: str, index: int, allocation: RayAllocation, servers: RolloutServersConfig,
                 engine: InProcessEngineConfig, seed: int, log_path: str, cfg: SupervisorConfig):  # fmt: skip
        import ray

        from asearch.launch.local import rollout_server_supervisor

        host = "127.0.0.1" if allocation.bind == "loopback" else ray.util.get_node_ip_address()
        if allocation.bind == "node":
            gloo_on_node_interface()  # the server's weight-update group (gloo on CPU) across nodes
        self.sup, self.url = rollout_server_supervisor(
            model, index, allocation, servers, engine, seed=seed, log_path=Path(log_path), cfg=cfg, host=host
        )

    def start(self) -> str:
        self.sup.start()
        return self.url

    def placement(self) -> dict[str, Any]:
        return actor_placement()

    def status(self) -> dict[str, Any]:
        s = self.sup
        return {"starts": s.starts, "restarts": s.restarts, "failed": s.failed, "pid": s.pid}

    def stop(self) -> None:
        self.sup.stop()


class TrainerRankActor:
    """One rank of the FSDP trainer: `setup` joins the process group (every rank at once), then each
    method is called on every rank with the same arguments, as `DistributedPolicyTrainer` requires."""

    def __init__(self, rank: int, world_size: int, threads: int):
        self.rank, self.world_size, self.threads = rank, world_size, threads
        self.store: Any = None  # the process group's rendezvous (a TCPStore): rank 0's from `address`, the others' from `setup`

    def address(self, bind: str) -> tuple[str, int]:
        """Where rank 0 hosts the process group's rendezvous: loopback (one machine) or this node's IP. The store
        listens from here on, on a port the OS picked: a port only looked up as free could be taken before the
        group forms (a Ray worker or a rollout server did, EADDRINUSE)."""
        import ray
        import torch.distributed as dist

        host = "127.0.0.1" if bind == "loopback" else ray.util.get_node_ip_address()
        self.store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        return host, self.store.port

    def placement(self) -> dict[str, Any]:
        return actor_placement()

    def setup(
        self, master: tuple[str, int], model: str, trainer_cfg: Any, temperature: float, total_steps: int,
        mesh_shape: tuple[int, int] | None = None, timeout_s: float | None = None,
    ) -> int:  # fmt: skip
        """Join the group and build the trainer: rank 0 loads `model`, the others build it on the meta device and
        receive rank 0's weights while sharding (no full copy on them). `mesh_shape`: (replicate, shard) for HSDP."""
        import torch
        import torch.distributed as dist

        from asearch.models.loading import empty_model, load_model
        from asearch.rl.distributed import DistributedPolicyTrainer, init_distributed

        # Ray gives each GPU actor its own CUDA_VISIBLE_DEVICES, so every rank's GPU is cuda:0.
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        torch.set_num_threads(self.threads)
        torch.manual_seed(0)  # the trainer's own seeded rng decides minibatches; this covers dropout etc.
        if self.rank != 0:  # a client of rank 0's store (env:// would prefix its keys differently)
            self.store = dist.TCPStore(master[0], master[1], is_master=False)
        backend = "gloo" if str(getattr(trainer_cfg, "device", "auto")).lower() == "cpu" else None
        if master[0] != "127.0.0.1":
            gloo_on_node_interface()  # the ranks' group, when gloo, reaches the other nodes
        env = init_distributed(backend, store=self.store, timeout_s=timeout_s)
        self.trainer = DistributedPolicyTrainer(
            load_model(model) if self.rank == 0 else empty_model(model), trainer_cfg, env=env,
            temperature=temperature, total_steps=total_steps, mesh_shape=mesh_shape,
        )  # fmt: skip
        return sum(p.numel() for p in self.trainer.model.parameters()) if self.rank == 0 else 0

    def train_step(self, samples: list[Any], policy_version: int, progress: float | None = None) -> dict[str, float]:
        return self.trainer.train_step(samples, policy_version=policy_version, progress=progress)

    def set_tokenizer(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer  # written next to every saved model (rank 0)

    def save_hf(self, directory: str, dtype: str | None = None) -> str:
        return str(self.trainer.save_hf(directory, getattr(self, "tokenizer", None), dtype))

    def weight_call(self, method: str, *args: Any) -> Any:
        """A collective weight-sync method of the trainer (`asearch.rl.broadcast.BroadcastsWeights`)."""
        return getattr(self.trainer, method)(*args)

    def state_dict(self) -> dict[str, Any] | None:
        state = self.trainer.state_dict()  # collective: every rank, the full state on rank 0
        return state if self.rank == 0 else None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.trainer.load_state_dict(state)

    def save_checkpoint(self, directory: str) -> None:
        self.trainer.save_checkpoint(Path(directory))  # this rank's shard; the driver receives nothing

    def load_checkpoint(self, directory: str) -> None:
        self.trainer.load_checkpoint(Path(directory))

    def weights_digest(self) -> list[float]:
        return self.trainer.weights_digest()


# ---------------------------------------------------------------------------- driver side


class RemoteSupervisor:
    """The `ServerSupervisor` view the rollout pool reads (`starts`, `restarts`, `failed`, `pid`) for a
    server supervised by an actor; a thread refreshes it every `poll_s` (a relaunched server loads its
    model for seconds before it is healthy, so the pool sees the new `starts` before it rejoins)."""

    def __init__(self, actor: Any, name: str, log_path: Path, poll_s: float = 0.25):
        self.actor, self.name, self.log_path, self.poll_s = actor, name, log_path, poll_s
        self.starts = self.restarts = 0
        self.failed: str | None = None
        self.pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        import ray

        st = ray.get(self.actor.status.remote(), timeout=30)
        self.starts, self.restarts, self.failed, self.pid = st["starts"], st["restarts"], st["failed"], st["pid"]

    def watch(self) -> None:
        self.refresh()

        def loop() -> None:
            while not self._stop.wait(self.poll_s):
                try:
                    self.refresh()
                except Exception as e:  # noqa: BLE001 - the actor is gone: the server is gone with it
                    self.failed = f"its Ray actor is unreachable: {type(e).__name__}: {e}"
                    return

        self._thread = threading.Thread(target=loop, name=f"watch-{self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop refreshing (the launcher stops the server itself)."""
        self._stop.set()


class RayTrainerGroup:
    """The trainer the RL loop drives (`train_step`, `save_hf`, `save_checkpoint`, `load_checkpoint`), run by
    `ranks` actors; each call goes to every rank and returns rank 0's answer."""

    def __init__(self, ranks: Sequence[Any], parameters: int, *, timeout_s: float = 1800.0, nodes: Sequence[str] = ()):
        self.ranks, self.parameters = list(ranks), parameters
        self.timeout_s = timeout_s  # allocation.rank_timeout_s
        self.nodes = list(nodes) or ["?"] * len(self.ranks)  # each rank's node address, for the error
        self._tokenizer: Any = None  # the one the ranks hold: sent once, not with every save

    def _all(self, method: str, *args: Any) -> list[Any]:
        """`method` on every rank; rank 0's answer first. The first rank to fail, or those that have not answered
        within `timeout_s` (a dead peer leaves the others waiting in a collective), raise a TrainerRankError."""
        import ray

        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        rank_of = {ref: k for k, ref in enumerate(refs)}
        pending, deadline = list(refs), time.monotonic() + self.timeout_s
        while pending:
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(deadline - time.monotonic(), 0.0))
            if not ready:
                late = ", ".join(f"{rank_of[r]} (node {self.nodes[rank_of[r]]})" for r in pending)
                raise TrainerRankError(f"trainer rank(s) {late} did not answer {method} within {self.timeout_s:.0f}s "
                                       "(allocation.rank_timeout_s); the run stops, its last checkpoint resumes it")  # fmt: skip
            try:
                ray.get(ready[0])
            except Exception as e:  # noqa: BLE001 - named and re-raised: the others would wait for it forever
                k, cause = rank_of[ready[0]], getattr(e, "cause", None) or e  # a RayTaskError wraps the rank's own
                raise TrainerRankError(f"trainer rank {k} (node {self.nodes[k]}) failed in {method}: "
                                       f"{type(cause).__name__}: {str(cause)[-2000:]}") from e  # fmt: skip
        return ray.get(refs)

    def train_step(self, samples: Sequence[Any], *, policy_version: int, progress: float | None = None) -> dict[str, float]:
        import ray

        ref = ray.put(list(samples))  # one copy in the object store, read by every rank
        return self._all("train_step", ref, policy_version, progress)[0]

    def save_hf(self, directory: str | os.PathLike[str], tokenizer: Any = None, dtype: str | None = None) -> Path:
        if tokenizer is not self._tokenizer:
            self._all("set_tokenizer", tokenizer)
            self._tokenizer = tokenizer
        return Path(self._all("save_hf", str(directory), dtype)[0])

    # collective weight sync (asearch.rl.broadcast): every rank takes part, rank 0's answer counts
    def weight_shapes(self) -> list[tuple[str, list[int]]]:
        return self._all("weight_call", "weight_shapes")[0]

    def weight_backend(self) -> str:
        return self._all("weight_call", "weight_backend")[0]

    def open_weight_store(self, server_urls: Sequence[str], timeout_s: float = 600.0) -> tuple[str, int] | None:
        return self._all("weight_call", "open_weight_store", list(server_urls), timeout_s)[0]

    def join_weight_group(self, address: Any, timeout_s: float = 600.0) -> None:
        self._all("weight_call", "join_weight_group", address, timeout_s)

    def broadcast_weights_or_leave(self, dtype: str = "bfloat16") -> int:
        return self._all("weight_call", "broadcast_weights_or_leave", dtype)[0]

    def leave_weight_group(self) -> None:
        self._all("weight_call", "leave_weight_group")

    def state_dict(self) -> dict[str, Any]:
        return self._all("state_dict")[0]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        import ray

        self._all("load_state_dict", ray.put(state))

    def save_checkpoint(self, directory: Path) -> None:
        self._all("save_checkpoint", str(directory))

    def load_checkpoint(self, directory: Path) -> None:
        self._all("load_checkpoint", str(directory))

    def weights_digest(self) -> list[float]:
        return self._all("weights_digest")[0]


@register_launcher("ray")
class RayLauncher(Launcher):
    """Places the allocation on a Ray cluster: `connect()` joins it and reserves every actor's place (placement
    groups), `start()` the servers (`urls`, `supervisors` for the pool), `trainer()` the FSDP ranks, `stop()`
    everything (idempotent; `asearch train` calls it on every exit)."""

    places_trainer = True
    options_model = RayAllocation
    allocation: RayAllocation

    def __init__(self, model: str, allocation: Allocation, servers: RolloutServersConfig, **kwargs: Any):
        super().__init__(model, allocation, servers, **kwargs)
        self._servers: list[Any] = []  # server actors, started or not: stop() stops each one's process
        self._actors: list[Any] = []
        self._groups: list[Any] = []  # placement groups: [servers', ranks'] once placed
        self._connected_here = self._checked = False
        self.bind: str = "loopback"
        self.runtime_env: dict[str, Any] = {}
        self.rank_bundles: list[int] = []  # the placement-group bundle of each trainer rank
        self.mesh_shape: tuple[int, int] | None = None  # (replicate, shard) for HSDP; None: 1-D
        self.nodes: dict[str, str] = {}  # alive node id -> its IP
        self.head: str | None = None  # the head node's IP

    # ---- the cluster

    def connect(self) -> None:
        """Join the cluster, size every reservation from its hardware, check that the allocation fits in its free
        resources and reserve them (once)."""
        import ray

        if self._checked:
            return
        if not ray.is_initialized():
            address = self.allocation.ray_address or os.environ.get("RAY_ADDRESS") or "auto"
            try:
                ray.init(address=address, log_to_driver=False, logging_level="warning")  # type: ignore[arg-type]  # ray takes a level name too
            except ConnectionError as e:
                raise LaunchError(
                    f"launcher=ray: no Ray cluster at {address!r} ({e}). Start one with `ray start --head "
                    "--num-cpus N` (RAY_AUTH_MODE=disabled on a private network), or set allocation.ray_address."
                ) from None
            self._connected_here = True
        self._size_from_cluster()
        self._check_free()
        self._place()
        self._checked = True

    def _size_from_cluster(self) -> None:
        """GPU reservations, bind and the actors' environment, from what the cluster reports."""
        import ray

        a = self.allocation
        alive = [n for n in ray.nodes() if n.get("Alive")]
        self.nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in alive}
        self.head = next((n["NodeManagerAddress"] for n in alive if HEAD_RESOURCE in n.get("Resources", {})), None)
        cluster_gpus = float(ray.cluster_resources().get("GPU", 0.0))
        self.server_cpus, self.rank_cpus = a.cpus(self.trainer_threads)
        self.server_gpus, self.rank_gpus = a.gpus(cluster_gpus, server_tensor_parallel(self.servers))
        for key in ("server_gpus", "rank_gpus"):
            if getattr(a, key) == 0 and cluster_gpus > 0:
                self.log(f"ray launcher: allocation.{key}=0 on a cluster with {cluster_gpus:g} GPUs: those actors see no GPU")
        self.bind = a.resolved_bind(len(alive))
        self.runtime_env = {"env_vars": a.actor_env(os.environ)}
        self.log(
            f"ray launcher: {len(alive)} node(s) ({', '.join(self._node_names())}), {cluster_gpus:g} GPU(s); "
            f"bind {self.bind}; each server {self.server_cpus:g} CPU/{self.server_gpus:g} GPU, each trainer rank "
            f"{self.rank_cpus:g} CPU/{self.rank_gpus:g} GPU; forwarded to actors: "
            f"{', '.join(sorted(self.runtime_env['env_vars'])) or 'nothing'}"
        )

    def _node_names(self) -> list[str]:
        return [ip + (" head" if ip == self.head else "") for ip in self.nodes.values()]

    def _check_free(self) -> None:
        """Ray would wait forever for an actor it cannot place: refuse an allocation larger than the free resources."""
        import ray

        a = self.allocation
        need = {
            "CPU": a.rollout_servers * self.server_cpus + a.trainer_ranks * self.rank_cpus,
            "GPU": a.rollout_servers * self.server_gpus + a.trainer_ranks * self.rank_gpus,
        }
        free = ray.available_resources()
        short = {k: (v, free.get(k, 0.0)) for k, v in need.items() if v > free.get(k, 0.0) + 1e-9}
        if short:
            raise LaunchError(
                "launcher=ray: the allocation needs "
                + ", ".join(f"{v:g} {k} (the cluster has {have:g} free)" for k, (v, have) in short.items())
                + f" for {a.rollout_servers} server(s) x {self.server_cpus:g} CPU/{self.server_gpus:g} GPU and "
                f"{a.trainer_ranks} trainer rank(s) x {self.rank_cpus:g} CPU/{self.rank_gpus:g} GPU; Ray would wait "
                "forever. Lower allocation.* (server_cpus, rank_cpus accept fractions) or add nodes."
            )
        self.log(
            f"ray launcher: {a.rollout_servers} {self.servers.kind} rollout server(s) and {a.trainer_ranks} "
            f"trainer rank(s) ({need['CPU']:g} CPUs, {need['GPU']:g} GPUs of the cluster's "
            f"{free.get('CPU', 0):g}/{free.get('GPU', 0):g} free); logs in {self.log_dir}"
        )

    def _place(self) -> None:
        """Reserve every actor's bundle, servers first so that they spread over the nodes (SPREAD), then the
        trainer ranks packed onto as few nodes as hold them (PACK), rank 0's bundle on `allocation.rank0_node`."""
        from ray.util.placement_group import placement_group_table

        a = self.allocation
        self._reserve("rollout servers", [bundle(self.server_cpus, self.server_gpus)] * a.rollout_servers, "SPREAD")
        ranks = [bundle(self.rank_cpus, self.rank_gpus) for _ in range(a.trainer_ranks)]
        ranks[0][self._rank0_resource()] = 0.001
        on_node = placement_group_table(self._reserve("trainer ranks", ranks, "PACK"))["bundles_to_node_id"]
        self.rank_bundles, self.mesh_shape = rank_layout([on_node[b] for b in range(a.trainer_ranks)], a.fsdp_mesh)
        mesh = "1-D (shard)" if self.mesh_shape is None else "2-D HSDP: replicate {} x shard {}".format(*self.mesh_shape)
        self.log(f"ray launcher: trainer ranks on {len(set(on_node.values()))} node(s), FSDP mesh {mesh}")

    def _rank0_resource(self) -> str:
        """The Ray resource that pins a bundle to `allocation.rank0_node` (every node has one of its own)."""
        where = self.allocation.rank0_node
        if where == "head":
            return HEAD_RESOURCE
        if where not in self.nodes.values():
            raise LaunchError(f"allocation.rank0_node={where!r}: no alive node has that address (nodes: {', '.join(self._node_names())})")
        return f"node:{where}"

    def _reserve(self, what: str, bundles: list[dict[str, float]], strategy: str) -> Any:
        """A ready placement group of `bundles`; one Ray cannot place in PLACEMENT_TIMEOUT_S is a LaunchError."""
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group

        group = placement_group(bundles, strategy=strategy)
        self._groups.append(group)
        try:
            ray.get(group.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            raise LaunchError(
                f"launcher=ray: Ray could not place the {what} ({len(bundles)} x {bundles[-1]}, {strategy}) in "
                f"{PLACEMENT_TIMEOUT_S:g} s: each one must fit on a single node (nodes: {', '.join(self._node_names())})"
            ) from None
        return group

    def _options(self, group: Any, index: int, cpus: float, gpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        return {"num_cpus": cpus, "num_gpus": gpus, "runtime_env": self.runtime_env, "scheduling_strategy": where}

    def _log_placement(self, what: str, placement: dict[str, Any], where: str) -> None:
        node = placement["node"] + (" (head)" if placement["node"] == self.head else "")
        gpus = ",".join(placement["gpus"]) or "none"
        self.log(f"ray launcher: {what} on node {node}, GPUs {gpus} (CUDA_VISIBLE_DEVICES={placement['cuda_visible']})" + (f", {where}" if where else ""))

    # ---- rollout servers

    def start(self) -> None:
        """Place and start every server at once; wait until all answer /health. On a failure, stop them all."""
        import ray

        self.connect()
        a = self.allocation
        placed = a.model_copy(update={"bind": self.bind})
        server_cls: Any = ray.remote(RolloutServerActor)  # ray types an actor's methods without `.remote`
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            actors = []
            for i in range(a.rollout_servers):
                log_path = self.log_dir / f"rollout-{i}.log"
                actor = server_cls.options(**self._options(self._groups[0], i, self.server_cpus, self.server_gpus)).remote(
                    self.model, i, placed, self.servers, self.engine.options, self.seed, str(log_path), self.sup_cfg
                )
                actors.append((actor, log_path))
                self._servers.append(actor)
                self._actors.append(actor)
            self.urls = ray.get([actor.start.remote() for actor, _ in actors])
            for i, ((actor, _), url) in enumerate(zip(actors, self.urls, strict=True)):
                self._log_placement(f"rollout server {i}", ray.get(actor.placement.remote()), f"serving {url}")
            self.supervisors = [
                RemoteSupervisor(actor, f"rollout-{i}", log_path) for i, (actor, log_path) in enumerate(actors)
            ]
            for s in self.supervisors:
                s.watch()
        except BaseException:  # also Ctrl-C while waiting: no server may outlive us
            self.stop()
            raise
        self.write_manifest()

    # ---- trainer ranks

    def trainer(self, trainer_cfg: Any, *, temperature: float, total_steps: int) -> RayTrainerGroup:
        """The FSDP trainer on `allocation.trainer_ranks` actors in their placement group: rank 0 loads `model`, the
        others receive its weights."""
        import ray

        self.connect()
        n = self.allocation.trainer_ranks
        rank_cls: Any = ray.remote(TrainerRankActor)  # ray types an actor's methods without `.remote`
        ranks = [
            rank_cls.options(**self._options(self._groups[1], b, self.rank_cpus, self.rank_gpus)).remote(r, n, self.trainer_threads)
            for r, b in enumerate(self.rank_bundles)
        ]  # fmt: skip
        self._actors += ranks
        t0 = time.perf_counter()
        master = ray.get(ranks[0].address.remote(self.bind))
        placements = ray.get([rank.placement.remote() for rank in ranks])
        for r, placement in enumerate(placements):
            self._log_placement(f"trainer rank {r}", placement, f"process group store at {master[0]}:{master[1]}" if r == 0 else "")
        timeout = self.allocation.rank_timeout_s
        setup = [r.setup.remote(master, self.model, trainer_cfg, temperature, total_steps, self.mesh_shape, timeout) for r in ranks]
        params = ray.get(setup)
        self.log(f"ray launcher: {n} trainer rank(s) ready in {time.perf_counter() - t0:.1f}s "
                 f"(process group at {master[0]}:{master[1]})")  # fmt: skip
        return RayTrainerGroup(ranks, params[0], timeout_s=timeout, nodes=[p["node"] for p in placements])

    # ---- the end

    def stop(self) -> None:
        """Stop every server process, end every actor, release the placement groups. Idempotent."""
        import ray

        if not ray.is_initialized():
            return
        try:
            for s in self.supervisors:
                s.close()
            stopping = [actor.stop.remote() for actor in self._servers]
            ray.wait(stopping, num_returns=len(stopping), timeout=60)
            for actor in self._actors:
                ray.kill(actor)
            for group in self._groups:
                ray.util.remove_placement_group(group)
        finally:  # a driver still connected when its cluster goes away is ended by Ray (exit 1, output unflushed)
            self._servers, self._actors, self.supervisors, self._groups = [], [], [], []
            if self._connected_here:
                ray.shutdown()
                self._connected_here = self._checked = False


# ---------------------------------------------------------------------------- placement (pure: unit-tested)

HEAD_RESOURCE = "node:__internal_head__"  # the resource only Ray's head node has
PLACEMENT_TIMEOUT_S = 120.0  # a just-killed actor hands its resources back asynchronously: allow for it


def bundle(cpus: float, gpus: float) -> dict[str, float]:
    """One actor's placement-group bundle (no GPU key when it reserves none: Ray refuses a zero amount)."""
    return {"CPU": cpus} | ({"GPU": gpus} if gpus > 0 else {})


def rank_layout(bundle_nodes: Sequence[str], mesh: str) -> tuple[list[int], tuple[int, int] | None]:
    """(the bundle of each trainer rank, the HSDP mesh shape or None for a 1-D mesh), given the node each bundle
    of the ranks' placement group landed on. Rank 0 is bundle 0 (on the chosen node); the ranks of one node are
    consecutive, rank 0's node first, as a (replicate, shard) mesh needs: its rows are the nodes. `mesh` auto is
    hybrid when the ranks span more than one node and every node holds as many."""
    by_node: dict[str, list[int]] = {}
    for b, node in enumerate(bundle_nodes):
        by_node.setdefault(node, []).append(b)
    order = [b for bundles in by_node.values() for b in bundles]
    even = len({len(bundles) for bundles in by_node.values()}) == 1
    if mesh == "hybrid" and not even:
        counts = ", ".join(str(len(bundles)) for bundles in by_node.values())
        raise LaunchError(f"allocation.fsdp_mesh=hybrid needs as many trainer ranks on every node; Ray placed {counts}")
    hybrid = mesh == "hybrid" or (mesh == "auto" and len(by_node) > 1 and even)
    return order, (len(by_node), len(bundle_nodes) // len(by_node)) if hybrid else None
