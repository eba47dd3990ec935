"""The local launcher (`launcher=local`): rollout servers as supervised subprocesses on this machine.

Server i is `asearch engine serve MODEL` (kind sglang) or a vLLM server (kind vllm) on 127.0.0.1 with
`allocation.server_threads` torch threads. Its `ServerSupervisor` waits for /health and relaunches it
when it exits, and its output goes to RUN/logs/rollout-<i>.log. RUN/logs/servers.json lists the URLs,
process ids and logs. `stop()` ends every server; `asearch train` calls it at the end of the run, on an
error and on Ctrl-C. The servers start from MODEL (labelled version 0); the trainer then pushes its
own weights to them.

On a GPU machine the servers and the trainer get disjoint GPUs: server i the i-th block of its
tensor-parallel size (its process's CUDA_VISIBLE_DEVICES), the trainer the first GPU after them (when its
`trainer.device` is auto). With too few GPUs for that they share, and the log says so.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asearch.engine.local.inprocess import InProcessEngineConfig
from asearch.engine.remote.pool import RolloutServersConfig
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.launch.registry import register_launcher
from asearch.launch.spec import Allocation, Launcher, server_tensor_parallel


@register_launcher("local")
class LocalLauncher(Launcher):
    """Start `allocation.rollout_servers` servers here; `urls` and `supervisors` say where they are."""

    def __init__(self, model: str, allocation: Allocation, servers: RolloutServersConfig, **kwargs: Any):
        super().__init__(model, allocation, servers, **kwargs)
        self.server_gpus, self.trainer_gpus = split_gpus(
            visible_gpus(), allocation.rollout_servers, server_tensor_parallel(servers)
        )
        made = [
            rollout_server_supervisor(
                model,
                i,
                allocation,
                servers,
                self.engine.options,  # the servers' batch, length, dtype and prefix cache
                seed=self.seed,
                log_path=self.log_dir / f"rollout-{i}.log",
                cfg=self.sup_cfg,
                gpus=self.server_gpus[i] if self.server_gpus else None,
            )
            for i in range(allocation.rollout_servers)
        ]
        self.supervisors: list[ServerSupervisor] = [sup for sup, _ in made]
        self.urls = [url for _, url in made]

    def trainer(self, trainer_cfg: Any, *, temperature: float, total_steps: int) -> None:
        """The trainer stays in this process; on a GPU machine it takes the first GPU no server has."""
        if not self.trainer_gpus:
            return None
        import torch

        self.log(
            f"local launcher: GPUs {', '.join(','.join(g) for g in self.server_gpus)} for the rollout servers, "
            f"{','.join(self.trainer_gpus)} for the trainer"
            + ("" if set(self.trainer_gpus).isdisjoint(g for ids in self.server_gpus for g in ids) else " (shared: too few GPUs)")
        )
        if str(trainer_cfg.device).lower() == "auto":
            torch.cuda.set_device(visible_gpus().index(self.trainer_gpus[0]))  # trainer.device auto -> this GPU
        return None

    def start(self) -> None:
        """Launch every server at once and wait until all answer /health. On a failure, stop them all."""
        a, cores = self.allocation, os.cpu_count() or 1
        threads = a.threads(self.trainer_threads)
        self.log(
            f"local launcher: {a.rollout_servers} {self.servers.kind} rollout server(s) x {a.server_threads} "
            f"thread(s) + {a.trainer_ranks} trainer rank(s) = {threads} threads on {cores} cores"
            + (" (oversubscribed: runs slower)" if threads > cores else "")
            + f"; logs in {self.log_dir}"
        )
        errors: list[BaseException] = []

        def start_one(sup: ServerSupervisor) -> None:
            try:
                sup.start()
            except BaseException as e:  # noqa: BLE001 - reported below, after every start has returned
                errors.append(e)

        workers = [threading.Thread(target=start_one, args=(s,), daemon=True) for s in self.supervisors]
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join()
            if errors:
                raise errors[0]
        except BaseException:  # also Ctrl-C while waiting: no server may outlive us
            self.stop()
            raise
        self.write_manifest()

    def stop(self) -> None:
        """SIGTERM every server's process group (SIGKILL after a grace period). Idempotent."""
        with ThreadPoolExecutor(len(self.supervisors)) as pool:
            list(pool.map(ServerSupervisor.stop, self.supervisors))


def rollout_server_supervisor(
    model: str,
    i: int,
    allocation: Allocation,
    servers: RolloutServersConfig,
    engine: InProcessEngineConfig,
    *,
    seed: int,
    log_path: Path,
    cfg: SupervisorConfig,
    host: str = "127.0.0.1",
    cores: int | None = None,
    gpus: list[str] | None = None,
) -> tuple[ServerSupervisor, str]:
    """Rollout server `i` of a run, not yet started, and its base URL: the server of engine kind
    `servers.kind` (its `serve` hook in the engine registry). Both launchers start servers through this.
    `gpus`: the GPU ids its process sees (CUDA_VISIBLE_DEVICES); None: those of this process."""
    from asearch.engine.registry import ServerLaunch, engine_kind
    from asearch.errors import LaunchError

    serve = engine_kind(servers.kind).serve
    if serve is None:
        raise LaunchError(f"engine kind {servers.kind!r} has no server a launcher can start")
    sup, url = serve(ServerLaunch(
        model, i, engine, servers.server_options(), seed, Path(log_path), cfg, threads=allocation.server_threads,
        host=host, served_model_name=servers.model_name, cores=cores,
    ))  # fmt: skip
    if gpus is not None:
        sup.env = {**(sup.env or {}), "CUDA_VISIBLE_DEVICES": ",".join(gpus)}
    return sup, url


def visible_gpus() -> list[str]:
    """The ids of the GPUs this process may use: CUDA_VISIBLE_DEVICES's, else 0..count-1 ([] without CUDA)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def split_gpus(gpus: list[str], servers: int, per_server: int) -> tuple[list[list[str]], list[str]]:
    """(each server's GPU ids, the trainer's): server i the i-th block of `per_server`, the trainer the rest.
    Too few for both: the servers still get their blocks (wrapping around) and the trainer the last GPU, shared.
    No GPUs: ([], [])."""
    if not gpus:
        return [], []
    blocks = [[gpus[(i * per_server + k) % len(gpus)] for k in range(per_server)] for i in range(servers)]
    rest = gpus[servers * per_server :]
    return blocks, rest or gpus[-1:]
