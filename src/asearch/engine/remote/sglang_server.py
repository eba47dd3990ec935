"""A real SGLang server as a rollout server: the launchers start `python -m sglang.launch_server` with the flags
the run's config implies, and the run talks to it with `SGLangEngine` (the same native API `asearch engine serve`
speaks: /generate with token ids and log-probs, weight updates from disk or from a distributed group).

    rollout_servers: {kind: sglang-server, sglang: {tp_size: 2, mem_fraction_static: 0.8}}

SGLang runs on GPUs (and on Intel AMX CPUs with `device: cpu`); where neither is there, `rollout_servers.kind:
sglang` starts asearch's own server with the same API instead. The server's context length is the run's
(`engine.max_seq_len`, which follows the agent's context budget); its weights are labelled version 0
(`--weight-version 0`) so the tokens it makes before the first update say so.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from typing import Any, Literal

from pydantic import Field

from asearch.engine.registry import EngineConfig, ServerLaunch, ServerOptions, register_engine
from asearch.engine.remote.sglang import SGLangEngine, SGLangEngineConfig, build_sglang
from asearch.engine.remote.vllm import server_gpus
from asearch.engine.supervisor import ServerSupervisor
from asearch.errors import LaunchError
from asearch.net import free_port

log = logging.getLogger(__name__)


class SGLangServerConfig(ServerOptions):
    """How a launcher starts a real SGLang server (`rollout_servers.sglang`, kind `sglang-server`)."""

    python: str | None = Field(
        None, description="The interpreter that has SGLang installed (None: this one). `-m sglang.launch_server` runs in it."
    )
    device: Literal["auto", "cuda", "cpu"] = Field(
        "auto",
        description="auto: cuda when this machine has a GPU, else an error that names kind sglang (asearch's own "
        "server, same API); cpu: SGLang's CPU backend (Intel AMX CPUs).",
    )
    tp_size: int = Field(
        1, ge=1, description="GPUs one server shards the model over (--tp-size); each server gets that many of its own."
    )
    mem_fraction_static: float | None = Field(
        None, gt=0, le=1, description="--mem-fraction-static: the share of GPU memory for weights and KV cache (None: SGLang's)."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description="--dtype.")
    cuda_graphs: bool = Field(True, description="False: --disable-cuda-graph (faster start, slower decode).")
    extra_args: list[str] = Field(
        default_factory=list, description="More SGLang flags, appended as given (e.g. [--attention-backend, fa3])."
    )

    def gpus_per_server(self) -> int:
        return self.tp_size


def sglang_server_command(
    model: str | os.PathLike[str],
    *,
    port: int,
    host: str,
    server: SGLangServerConfig,
    device: str,
    context_length: int | None,
    seed: int,
    served_model_name: str | None = None,
) -> list[str]:
    """The `python -m sglang.launch_server` command line of one rollout server."""
    cmd = [server.python or sys.executable, "-m", "sglang.launch_server", "--model-path", str(model)]
    cmd += ["--host", host, "--port", str(port), "--tp-size", str(server.tp_size), "--device", device]
    cmd += ["--random-seed", str(seed), "--weight-version", "0", "--dtype", server.dtype]
    if context_length is not None:
        cmd += ["--context-length", str(context_length)]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if server.mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(server.mem_fraction_static)]
    if not server.cuda_graphs:
        cmd += ["--disable-cuda-graph"]
    return cmd + list(server.extra_args)


def sglang_device(server: SGLangServerConfig) -> str:
    """The device the server runs on; a CPU-only machine asked for auto is an error naming the alternative."""
    if server.device != "auto":
        return server.device
    import torch

    if torch.cuda.is_available():
        return "cuda"
    raise LaunchError(
        "rollout_servers.kind=sglang-server starts real SGLang servers, which need a GPU here (no CUDA device is "
        "visible). On a CPU use rollout_servers.kind=sglang (asearch engine serve, the same API), or "
        "rollout_servers.sglang.device=cpu for SGLang's CPU backend (Intel AMX)."
    )


def check_sglang_installed(python: str | None) -> None:
    """A LaunchError before any server starts when `python` cannot import SGLang."""
    if python in (None, sys.executable):
        found = importlib.util.find_spec("sglang") is not None
    else:
        probe = subprocess.run([python, "-c", "import sglang"], capture_output=True, timeout=120)
        found = probe.returncode == 0
    if not found:
        raise LaunchError(
            f"rollout_servers.kind=sglang-server: {python or sys.executable} cannot import sglang; install it there "
            "(pip install 'sglang[all]', GPU machines) or set rollout_servers.sglang.python"
        )


def serve_sglang_server(launch: ServerLaunch) -> tuple[ServerSupervisor, str]:
    """Rollout server `launch.index` of a run (not started): SGLang with `rollout_servers.sglang`'s settings on
    `tp_size` GPUs of its own, the run's context length (`engine.max_seq_len`) and seed."""
    server = launch.options if isinstance(launch.options, SGLangServerConfig) else SGLangServerConfig()
    index, host, engine, seed = launch.index, launch.host, launch.engine, launch.seed
    device = sglang_device(server)
    check_sglang_installed(server.python)
    port = free_port(host)
    child_env: dict[str, str] = {}
    if device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        child_env["CUDA_VISIBLE_DEVICES"] = server_gpus(index, server.tp_size, visible)
    cmd = sglang_server_command(
        launch.model, port=port, host=host, server=server, device=device, context_length=engine.max_seq_len,
        seed=seed + index, served_model_name=launch.served_model_name,
    )  # fmt: skip
    log.info("SGLang server %d on %s:%d (%s, tp %d): %s", index, host, port, device, server.tp_size, " ".join(cmd))
    sup = ServerSupervisor(
        cmd, f"http://{host}:{port}/health", log_path=launch.log_path, env=child_env, cfg=launch.supervisor,
        name=f"sglang:{port}",
    )
    return sup, f"http://{host}:{port}"


@register_engine(
    "sglang-server",
    options=SGLangEngineConfig,
    needs_url=True,
    rollouts=True,
    serve=serve_sglang_server,
    server_options=SGLangServerConfig,
    server_section="sglang",
    summary="a real SGLang server a launcher starts (python -m sglang.launch_server; GPU), SGLang's native API",
)
def build_sglang_server(cfg: EngineConfig, **context: Any) -> SGLangEngine:
    """The client is the one of kind sglang: only who starts the servers differs."""
    return build_sglang(cfg, **context)
