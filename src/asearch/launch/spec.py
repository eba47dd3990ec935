"""What a launcher places (`Allocation`) and what every launcher does (`Launcher`: start, stop, manifest)."""

from __future__ import annotations

from collections.abc import Callable
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
    server_gpus: float = Field(0, ge=0, description="launcher=ray: GPUs each rollout server reserves (its tp).")
    rank_gpus: float = Field(0, ge=0, description="launcher=ray: GPUs each trainer rank reserves (1 on GPU).")
    bind: Literal["loopback", "node"] = Field(
        "loopback",
        description="launcher=ray: servers listen on 127.0.0.1 (one machine) or on their node's IP (a "
        "cluster: the trainer reaches them across nodes; keep the cluster network private).",
    )

    def threads(self, trainer_threads: int) -> int:
        """CPU threads the run asks for: every server's, plus the trainer's."""
        return self.rollout_servers * self.server_threads + self.trainer_ranks * trainer_threads

    def cpus(self, trainer_threads: int) -> tuple[float, float]:
        """Ray CPU reservations: (per server, per trainer rank)."""
        return (self.server_cpus or float(self.server_threads), self.rank_cpus or float(trainer_threads))


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
