"""SGLang behind the `Engine` protocol, over its native `/generate` API (token ids in, ids + log-probs out).

Weight updates: `/pause_generation` (mode abort: in-flight requests return with what they have, new ones
wait), `/update_weights_from_disk` with a `weight_version` label (or, collective, one
`/update_weights_from_distributed` per bucket after `/init_weights_update_group`), `/continue_generation`. Aborted requests
are resent with their tokens so far. With `update_kv: keep` the pause is in place and the update keeps the
cache (`flush_cache: false`): running requests go on under the new weights with the KV the old ones
computed, nothing is resent or prefilled again (PipelineRL's in-flight update). SGLang reports the label of
the weights that made each response (`meta_info.weight_version`), which the engine uses as the tokens'
version when it is an integer (per token when the server lists them, as `asearch engine serve` does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, Literal

from pydantic import Field

from asearch.config import Config
from asearch.engine.registry import EngineConfig, ServerLaunch, register_engine
from asearch.engine.remote.http import (
    Chunk,
    HttpConfig,
    JsonHttpClient,
    ResumableRemoteEngine,
    check_weights_dir,
)
from asearch.engine.supervisor import ServerSupervisor
from asearch.engine.types import UPDATE_KV_HELP, GenerateRequest, UpdateKV, WeightSource
from asearch.engine.weight_group import Bucket, GroupAddress
from asearch.errors import RemoteError

log = logging.getLogger(__name__)


class SGLangEngineConfig(Config):
    """Client-side knobs of `SGLangEngine`."""

    http: HttpConfig = Field(default_factory=HttpConfig, description="Timeouts, retries, concurrency.")
    model_eos_stops: bool = Field(
        False,
        description="Also stop at the model's own EOS. False: only SamplingParams.stop_token_ids end a "
        "generation, the same rule as the other engines.",
    )
    max_resends: int = Field(16, ge=0, description="Resends of one request after aborts before giving up.")
    initial_version: int = Field(0, description="Policy version of the weights the server starts with.")
    pause_mode: Literal["in_place", "retract"] = Field(
        "in_place",
        description="Mode of /pause_generation for Engine.pause(): 'in_place' freezes running requests with "
        "their KV cache; 'retract' moves them back to the queue (KV recomputed on resume).",
    )
    update_kv: UpdateKV = Field("keep", description=UPDATE_KV_HELP)
    trust_server_version: bool = Field(
        True,
        description="Tag tokens with the server's meta_info.weight_version when it is an integer (it names "
        "the weights that actually ran), else with the version current when the request was sent.",
    )


class SGLangEngine(ResumableRemoteEngine):
    """`Engine` over one or more SGLang servers serving the same model (see `ResumableRemoteEngine`)."""

    what = "SGLang server"

    def __init__(self, base_url: str | Sequence[str], *, cfg: SGLangEngineConfig | None = None):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.cfg = cfg or SGLangEngineConfig()
        super().__init__(
            urls,
            http=self.cfg.http,
            max_resends=self.cfg.max_resends,
            initial_version=self.cfg.initial_version,
        )

    @property
    def updates_in_place(self) -> bool:  # type: ignore[override]
        return self.cfg.update_kv == "keep"

    async def pause(self) -> None:
        """Freeze generation on the servers (`cfg.pause_mode`); no new chunks leave this client."""
        self._user_paused = True
        self._admit.clear()
        for s in self._servers:
            await s.post_json("/pause_generation", {"mode": self.cfg.pause_mode})

    async def resume(self) -> None:
        self._user_paused = False
        if not self._updating:
            for s in self._servers:
                await s.post_json("/continue_generation", {})
        self._open_gate()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        """Every server loads the directory `source` (update_weights_from_disk, labelled `version`) inside
        `_update_window`'s pause."""
        path = check_weights_dir(source)
        keep = self.updates_in_place
        async with self._update_window(version, path):
            for s in self._servers:
                body = {
                    "model_path": str(path),
                    "weight_version": str(version),
                    "flush_cache": not keep,  # the radix cache holds KV computed by the old weights
                    "abort_all_requests": not keep,
                }
                await self._post_update(s, "/update_weights_from_disk", body, str(path))

    async def init_weights_update_group(self, address: GroupAddress, rank_offset: int, ranks_per_server: int = 1) -> None:
        """Every server joins the trainer's weight group (server i from rank `rank_offset + i * ranks_per_server`:
        SGLang adds its tensor-parallel ranks); returns once the group is formed, so the trainer joins meanwhile."""
        await asyncio.gather(
            *(
                self._post_update(
                    s, "/init_weights_update_group", address.body(rank_offset + i * ranks_per_server), address.group_name
                )
                for i, s in enumerate(self._servers)
            )
        )

    async def update_weights_from_distributed(self, buckets: Sequence[Bucket], version: int, group_name: str) -> None:
        """Receive `version` over the weight group, bucket by bucket, while the trainer broadcasts it: the same
        pause and resume as `update_weights`; the last bucket carries the version label (and the cache flush)."""
        keep = self.updates_in_place
        async with self._update_window(version, f"group {group_name}"):
            for i, bucket in enumerate(buckets):
                body = bucket.body(group_name)
                body |= {"flush_cache": not keep and i == len(buckets) - 1, "abort_all_requests": False}
                if i == len(buckets) - 1:
                    body["weight_version"] = str(version)
                await asyncio.gather(
                    *(self._post_update(s, "/update_weights_from_distributed", body, group_name) for s in self._servers)
                )

    async def destroy_weights_update_group(self, group_name: str) -> None:
        for s in self._servers:
            await s.post_json("/destroy_weights_update_group", {"group_name": group_name}, retries=0)

    @contextlib.asynccontextmanager
    async def _update_window(self, version: int, source: Any) -> AsyncIterator[None]:
        """pause_generation(abort) -> the update -> continue_generation, recorded as `version`; with
        `update_kv: keep`, pause_generation(in_place) and an update that keeps the cache.

        SGLang's abort-mode pause returns only once nothing runs, and requests that arrive while paused
        wait at the server until it continues, so they run (and are labelled) under the new weights.
        """
        keep = self.updates_in_place
        async with self._update_lock:
            start = time.monotonic()
            self._updating = True
            self._admit.clear()
            try:
                if not (keep and self._user_paused):  # keep: requests frozen by the user's pause stay so
                    for s in self._servers:
                        await s.post_json("/pause_generation", {"mode": "in_place" if keep else "abort"})
                try:
                    yield
                    self._record_update(version, start, source)
                finally:
                    if not self._user_paused:
                        for s in self._servers:
                            await s.post_json("/continue_generation", {})
            finally:
                self._updating = False
                self._open_gate()

    async def _post_update(self, server: JsonHttpClient, path: str, body: dict, what: str) -> None:
        # No retry: a half-applied update must be looked at, not repeated blindly.
        resp = await server.post_json(path, body, retries=0)
        if not (resp or {}).get("success", False):
            raise RemoteError(f"SGLang server {server.base_url} refused {path} for {what}: {(resp or {}).get('message')!r}")

    async def flush_cache(self) -> None:
        """Drop every server's radix (prefix) cache."""
        for s in self._servers:
            await s.request("POST", "/flush_cache")

    # ------------------------------------------------------------------ internals

    async def _send_chunk(
        self,
        server: JsonHttpClient,
        request: GenerateRequest,
        prompt: list[int],
        max_tokens: int,
        attempt: int,
    ) -> Chunk:
        sp = request.sampling
        sampling: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "top_k": sp.top_k if sp.top_k > 0 else -1,  # SGLang: -1 disables
            "stop": list(sp.stop),
            "stop_token_ids": list(sp.stop_token_ids),
            "no_stop_trim": True,  # our contract: the output includes the stop string
            "ignore_eos": not self.cfg.model_eos_stops,
            "skip_special_tokens": False,
        }
        if sp.seed is not None:
            sampling["sampling_seed"] = sp.seed
        body = {
            "input_ids": prompt,
            "sampling_params": sampling,
            "return_logprob": True,
            "rid": f"{request.request_id}-{attempt}",
            "stream": False,
        }
        data = await server.post_json("/generate", body)
        chunk = _parse_generate(data, server.base_url)
        if not self.cfg.trust_server_version:
            chunk.server_version = chunk.token_versions = None
        return chunk


def _parse_generate(data: Any, url: str) -> Chunk:
    """A `Chunk` from a /generate body: meta_info.output_token_logprobs holds (logprob, token_id, text)."""
    try:
        if isinstance(data, list):  # a batch answer; we always send one prompt
            data = data[0]
        meta = data["meta_info"]
        entries = meta.get("output_token_logprobs") or []
        lps = [e[0] for e in entries]
        ids = [int(e[1]) for e in entries]
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else reason
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise RemoteError(f"SGLang server {url}: unexpected /generate body ({e!r}): {str(data)[:300]}") from e
    if "output_ids" in data and data["output_ids"] is not None and list(data["output_ids"]) != ids:
        raise RemoteError(f"SGLang server {url}: output_ids disagree with output_token_logprobs")
    if any(x is None for x in lps):
        raise RemoteError(f"SGLang server {url}: missing log-probs; was return_logprob honoured?")
    if kind not in ("stop", "length", "abort"):
        raise RemoteError(f"SGLang server {url}: unexpected finish_reason {reason!r}")
    server_version = _int_label(meta.get("weight_version"))
    labels = meta.get("output_token_weight_versions")
    token_versions = [_int_label(x) for x in labels] if isinstance(labels, list) and len(labels) == len(ids) else []
    return Chunk(
        ids=ids,
        logprobs=[float(x) for x in lps],
        finish=kind,
        text=data.get("text") or "",
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or len(ids)),
        server_version=server_version,
        token_versions=token_versions or None,
    )


def _int_label(label: Any) -> int | None:
    """A weight_version label as a policy version when it is an integer."""
    return int(label) if isinstance(label, int | str) and str(label).lstrip("-").isdigit() else None


def serve_rollout_server(launch: ServerLaunch) -> tuple[ServerSupervisor, str]:
    """Rollout server `launch.index` of a run (not started): `asearch engine serve` (SGLang's API) with every
    in-process option of the run's engine (`engine.*`: batch, length, prefill chunk and budget, device, dtype,
    prefix cache, ...), `launch.threads` torch threads and a seed of its own."""
    from asearch.engine.server.app import engine_server_supervisor

    # its own seed (servers sample different streams) and the allocation's threads, not the in-process engine's
    engine = launch.engine.model_copy(update={"seed": launch.seed + launch.index, "threads": launch.threads})
    return engine_server_supervisor(
        launch.model,
        log_path=launch.log_path,
        host=launch.host,
        threads=launch.threads,
        engine=engine,
        weight_version="0",  # the launch weights are version 0; tokens made with them say so
        extra_args=["--exit-with-parent"],
        cfg=launch.supervisor,
    )


@register_engine(
    "sglang",
    options=SGLangEngineConfig,
    needs_url=True,
    rollouts=True,
    serve=serve_rollout_server,
    summary="an SGLang server, or `asearch engine serve` (SGLang's native API: token ids, weight updates)",
)
def build_sglang(cfg: EngineConfig, **context: Any) -> SGLangEngine:
    assert cfg.base_url is not None  # EngineConfig checks it for kinds that need a server
    return SGLangEngine(cfg.base_url, cfg=cfg.options)
