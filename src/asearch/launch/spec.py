"""What a launcher places (`Allocation`) and what every launcher does (`Launcher`: start, stop, manifest).

A launcher's own options are an `Allocation` subclass it names as `options_model`: they sit under `allocation.`
beside the common keys (the Ray launcher's `allocation.ray_address`, `RayAllocation` in launch/ray.py), and
`TrainConfig` validates `allocation` against the options model of the launcher it picks.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from asearch.config import Config
from asearch.engine.registry import EngineConfig
from asearch.engine.remote.pool import RolloutServersConfig
from asearch.engine.supervisor import SupervisorConfig
from asearch.files import atomic_write_json

if TYPE_CHECKING:
    from asearch.rl.trainer import Trainer


class Allocation(Config):
    """Rollout servers and trainer ranks of one run (e.g. 4 servers x 1 GPU and 4 FSDP ranks on a cluster): the
    keys every launcher reads. A launcher with options of its own subclasses it (its `options_model`)."""

    rollout_servers: int = Field(2, ge=1, description="Rollout server processes to start.")
    server_threads: int = Field(1, ge=1, description="torch threads of each rollout server (CPU).")
    trainer_ranks: int = Field(
        1, ge=1, description="FSDP trainer processes (launcher=ray; launcher=local trains in this process)."
    )
    def threads(self, trainer_threads: int) -> int:
        """CPU threads the run asks for: every server's, plus the trainer's."""
        return self.rollout_servers * self.server_threads + self.trainer_ranks * trainer_threads


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
    options = servers.server_options()  # the kind's own (`rollout_servers.vllm`, `rollout_servers.sglang`, ...)
    return options.gpus_per_server() if options is not None else 1


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
    # Its options: Allocation plus the launcher's own keys (under `allocation.` in a config)
    options_model: ClassVar[type[Allocation]] = Allocation

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
        if not isinstance(allocation, self.options_model):  # the common keys given alone: this launcher's defaults
            allocation = self.options_model.model_validate(allocation.model_dump(exclude_unset=True))
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
