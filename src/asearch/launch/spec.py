"""What a launcher places (`Allocation`) and what every launcher does (`Launcher`: start, stop, manifest)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from asearch.config import Config
from asearch.engine.pool import RolloutServersConfig
from asearch.engine.registry import EngineConfig
from asearch.engine.supervisor import SupervisorConfig
from asearch.files import atomic_write_json

if TYPE_CHECKING:
    from asearch.rl.trainer import Trainer


class Allocation(Config):
    """Rollout servers and trainer ranks of one run (e.g. 4 servers x 1 GPU and 4 FSDP ranks on a cluster)."""

    rollout_servers: int = Field(2, ge=1, description="Rollout server processes to start.")
    server_threads: int = Field(1, ge=1, description="torch threads of each rollout server (CPU).")
    trainer_ranks: int = Field(
        1, ge=1, description="FSDP trainer processes (launcher=ray; launcher=local trains in this process)."
    )
    # ---- Ray only
    ray_address: str | None = Field(
        None,
        description="launcher=ray: the cluster to join (host:port of `ray start --head`); None: the "
        "RAY_ADDRESS variable, else the cluster started on this machine.",
    )
    server_cpus: float | None = Field(
        None, gt=0, description="launcher=ray: CPUs each server actor reserves (default server_threads)."
    )
    rank_cpus: float | None = Field(
        None, gt=0, description="launcher=ray: CPUs each trainer rank reserves (default: the run's threads)."
    )
    server_gpus: float | None = Field(
        None, ge=0, description="launcher=ray: GPUs each rollout server reserves; None: its tensor-parallel size "
        "when the cluster has GPUs, else 0 (an explicit 0 on a GPU cluster is allowed and logged).",
    )
    rank_gpus: float | None = Field(
        None, ge=0, description="launcher=ray: GPUs each trainer rank reserves; None: 1 when the cluster has "
        "GPUs, else 0 (an explicit 0 on a GPU cluster is allowed and logged).",
    )
    bind: Literal["auto", "loopback", "node"] = Field(
        "auto",
        description="launcher=ray: where servers and rank 0's rendezvous store listen and what they advertise: "
        "loopback (127.0.0.1: one machine), node (the node's IP: the trainer reaches them across nodes; keep the "
        "cluster network private), auto (node once the cluster has more than one alive node, else loopback).",
    )
    rank0_node: str = Field(
        "head",
        description="launcher=ray: the node trainer rank 0 (the process that writes weights and checkpoints) "
        "is placed on: head, or a node's IP address.",
    )
    fsdp_mesh: Literal["auto", "shard", "hybrid"] = Field(
        "auto",
        description="launcher=ray: shard (1-D: parameters sharded over every rank), hybrid (2-D, HSDP: sharded "
        "within a node, replicated across nodes; every node must hold the same number of ranks), auto (hybrid "
        "when the ranks span more than one node and every node holds the same number, else shard).",
    )
    rank_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="launcher=ray: how long one call on the trainer ranks (a train step, a save, a weight push) may "
        "take; a rank that has not answered by then, or that failed, stops the run with an error naming it and its "
        "node (the last checkpoint resumes it). Also the ranks' collective timeout (init_process_group).",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="launcher=ray: environment variables set in every actor (and its server process), on top "
        "of the allow-listed ones forwarded from this process (asearch.launch.spec.FORWARDED_ENV).",
    )

    def threads(self, trainer_threads: int) -> int:
        """CPU threads the run asks for: every server's, plus the trainer's."""
        return self.rollout_servers * self.server_threads + self.trainer_ranks * trainer_threads

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


# Forwarded to every Ray actor (runtime_env): communication, hub/cache, asearch, torch and thread settings. Not
# CUDA_VISIBLE_DEVICES: Ray sets each actor's own from the GPUs it reserved.
FORWARDED_ENV_PREFIXES = (
    "NCCL_", "GLOO_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "ASEARCH_", "CUDA_", "PYTORCH_", "TORCH_",
    "VLLM_", "SGLANG_", "TORCHINDUCTOR_", "TRITON_",
)  # fmt: skip
FORWARDED_ENV = (
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
)  # fmt: skip
NOT_FORWARDED_ENV = ("CUDA_VISIBLE_DEVICES",)


def server_tensor_parallel(servers: RolloutServersConfig) -> int:
    """GPUs one rollout server of this kind spans (its tensor-parallel size; 1 for kinds without one)."""
    if servers.kind == "vllm":
        return int(servers.vllm.tensor_parallel_size)
    if servers.kind == "sglang-server":  # a real SGLang server (`rollout_servers.sglang`)
        return int(servers.sglang.tp_size)
    return 1


def forwarded(name: str) -> bool:
    """Whether environment variable `name` of the driver reaches every actor."""
    if name in NOT_FORWARDED_ENV:
        return False
    return name in FORWARDED_ENV or name.startswith(FORWARDED_ENV_PREFIXES)


class Launcher:
    """Starts a run's rollout servers (`start`), says where they are (`urls`, and `supervisors` for the
    pool: `starts`, `restarts`, `failed`, `pid`, `name`, `log_path`) and stops them (`stop`, idempotent).
    `trainer()` places the trainer too, or returns None: it trains in this process.
    A new launcher is one subclass in its own file, registered with `asearch.launch.registry.register_launcher`."""

    # True for a launcher whose `trainer()` places trainer ranks (allocation.trainer_ranks > 1 needs one)
    places_trainer: ClassVar[bool] = False

    def __init__(
        self,
        model: str,
        allocation: Allocation,
        servers: RolloutServersConfig,
        *,
        log_dir: Path,
        engine: EngineConfig | None = None,
        seed: int = 0,
        trainer_threads: int = 1,
        supervisor: SupervisorConfig | None = None,
        log: Callable[[str], Any] = print,
    ):
        self.model, self.allocation, self.servers, self.log_dir = model, allocation, servers, Path(log_dir)
        self.engine, self.seed, self.trainer_threads = engine or EngineConfig(), seed, trainer_threads
        self.sup_cfg, self.log = supervisor or SupervisorConfig(), log
        self.urls: list[str] = []
        self.supervisors: list[Any] = []

    def trainer(self, trainer_cfg: Any, *, temperature: float, total_steps: int) -> Trainer | None:
        """The trainer this launcher places (a `Trainer`), or None: the run trains in its own process."""
        return None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def write_manifest(self) -> None:
        """RUN/logs/servers.json: name, URL, current pid, crash restarts and log of every server."""
        atomic_write_json(
            self.log_dir / "servers.json",
            [
                {"name": s.name, "url": u, "pid": s.pid, "restarts": s.restarts, "log": str(s.log_path)}
                for s, u in zip(self.supervisors, self.urls, strict=True)
            ],
        )

    def __enter__(self) -> Launcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
