"""The local launcher (`launcher=local`): rollout servers as supervised subprocesses on this machine.

Server i is `asearch engine serve MODEL` (kind sglang) or a vLLM server (kind vllm) on 127.0.0.1 with
`allocation.server_threads` torch threads. Its `ServerSupervisor` waits for /health and relaunches it
when it exits, and its output goes to RUN/logs/rollout-<i>.log. RUN/logs/servers.json lists the URLs,
process ids and logs. `stop()` ends every server; `asearch train` calls it at the end of the run, on an
error and on Ctrl-C. The servers start from MODEL (labelled version 0); the trainer then pushes its
own weights to them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asearch.engine.inprocess import InProcessEngineConfig
from asearch.engine.pool import RolloutServersConfig
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.files import atomic_write_json
from asearch.launch.spec import Allocation


class LocalLauncher:
    """Start `allocation.rollout_servers` servers here; `urls` and `supervisors` say where they are."""

    def __init__(
        self,
        model: str,
        allocation: Allocation,
        servers: RolloutServersConfig,
        *,
        log_dir: Path,
        engine: InProcessEngineConfig | None = None,
        seed: int = 0,
        trainer_threads: int = 1,
        supervisor: SupervisorConfig | None = None,
        log: Callable[[str], Any] = print,
    ):
        self.allocation, self.servers, self.log_dir, self.log = allocation, servers, Path(log_dir), log
        self.trainer_threads = trainer_threads
        made = [
            self._supervisor(
                model, i, engine or InProcessEngineConfig(), seed, supervisor or SupervisorConfig()
            )
            for i in range(allocation.rollout_servers)
        ]
        self.supervisors: list[ServerSupervisor] = [sup for sup, _ in made]
        self.urls: list[str] = [url for _, url in made]

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

    def write_manifest(self) -> None:
        """RUN/logs/servers.json: name, URL, current pid, crash restarts and log of every server."""
        atomic_write_json(
            self.log_dir / "servers.json",
            [
                {"name": s.name, "url": u, "pid": s.pid, "restarts": s.restarts, "log": str(s.log_path)}
                for s, u in zip(self.supervisors, self.urls, strict=True)
            ],
        )

    def __enter__(self) -> LocalLauncher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _supervisor(
        self, model: str, i: int, engine: InProcessEngineConfig, seed: int, sup_cfg: SupervisorConfig
    ) -> tuple[ServerSupervisor, str]:
        log_path = self.log_dir / f"rollout-{i}.log"
        t = self.allocation.server_threads
        if self.servers.kind == "vllm":
            from asearch.engine.vllm import vllm_server_supervisor

            cores = os.cpu_count() or 1
            first = (i * t) % cores
            last = min(first + t, cores) - 1  # server i binds its own cores when there are enough
            return vllm_server_supervisor(
                model,
                log_path=log_path,
                served_model_name=self.servers.model_name,
                max_model_len=engine.max_seq_len,
                env={"VLLM_CPU_OMP_THREADS_BIND": f"{first}-{last}"},
                cfg=sup_cfg,
            )
        from asearch.engine.server import engine_server_supervisor

        return engine_server_supervisor(
            model,
            log_path=log_path,
            threads=t,
            max_batch=engine.max_batch,
            max_seq_len=engine.max_seq_len,
            seed=seed + i,  # servers sample different streams for requests without a seed
            weight_version="0",  # the launch weights are version 0; tokens made with them say so
            extra_args=["--dtype", engine.dtype, "--prefix-cache-mb", str(engine.prefix_cache_mb)],
            cfg=sup_cfg,
        )
