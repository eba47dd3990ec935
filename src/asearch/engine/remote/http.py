"""HTTP plumbing shared by the remote engines: their JSON client and the resumable token-engine core.

`JsonHttpClient` is `asearch.net.JsonClient` under `HttpConfig`: connect errors, timeouts and the
statuses of `asearch.net.RETRYABLE_STATUS` are retried (Retry-After honoured); any other 4xx or 5xx fails
at once, because resending a bad request cannot fix it. `ResumableRemoteEngine` holds what vLLM and SGLang
clients share: admission gate, in-flight accounting, per-token version tags fixed at send time, resending
aborted requests with their tokens so far, and sticky routing by trajectory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from asearch.engine.types import GenerateRequest, GenerateResponse, StopReason, WeightSource
from asearch.errors import RemoteError
from asearch.net import RETRYABLE_STATUS, JsonClient, RemoteHTTPError, RetryConfig, RetryPolicy, RetryStats
from asearch.net.retry import parse_retry_after

log = logging.getLogger(__name__)

__all__ = [
    "RETRY_STATUS",
    "HttpConfig",
    "HttpStats",
    "JsonHttpClient",
    "RemoteHTTPError",
    "ResumableRemoteEngine",
    "backoff_delay",
    "parse_retry_after",
]

RETRY_STATUS = RETRYABLE_STATUS  # the name engine modules import
HttpStats = RetryStats


class HttpConfig(RetryConfig):
    """Timeouts, concurrency and retry policy for one remote server (retry knobs: asearch.net.retry;
    the older backoff_base_s, backoff_max_s, retry_after_max_s still load, with a warning)."""

    timeout_s: float = Field(600.0, gt=0, description="Read timeout of one HTTP call (a long generation).")
    connect_timeout_s: float = Field(10.0, gt=0, description="TCP connect timeout.")
    retries: int = Field(5, ge=0, description="Extra attempts after the first on retryable failures.")
    max_backoff_s: float = Field(30.0, ge=0, description="Cap on one backoff wait.")
    max_retry_after_s: float = Field(120.0, ge=0, description="Cap on a server's Retry-After we will honour.")
    max_concurrency: int = Field(64, ge=1, description="Requests in flight at once from this client.")


def backoff_delay(attempt: int, cfg: RetryConfig, retry_after: float | None = None) -> float:
    """Delay before retry number `attempt` (0-based) under `cfg` (`RetryPolicy.delay`)."""
    return RetryPolicy(cfg).delay(attempt, retry_after)


class JsonHttpClient(JsonClient):
    """A `JsonClient` for one engine server, configured by `HttpConfig`; `post_json`/`get_json` retry per it."""

    def __init__(
        self,
        base_url: str,
        *,
        cfg: HttpConfig | None = None,
        headers: dict[str, str] | None = None,
        what: str = "server",
    ):
        self.cfg = cfg or HttpConfig()
        super().__init__(
            base_url,
            retry=self.cfg,
            timeout_s=self.cfg.timeout_s,
            connect_timeout_s=self.cfg.connect_timeout_s,
            max_connections=self.cfg.max_concurrency + 8,
            headers=headers,
            what=what,
            hint=f"Check that the server is running and reachable at {base_url.rstrip('/')} (its /health "
            "endpoint), and read its log; raise HttpConfig.timeout_s if generations are just long.",
        )

    async def post_json(self, path: str, payload: dict[str, Any] | None = None, *, retries: int | None = None) -> Any:
        return await self.request_json("POST", path, payload, retries=retries)

    async def get_json(self, path: str, *, retries: int | None = None) -> Any:
        return await self.request_json("GET", path, None, retries=retries)


# ---------------------------------------------------------------------- resumable token engines


@dataclass(slots=True)
class Chunk:
    """What one generation call to a server returned."""

    ids: list[int]
    logprobs: list[float]
    finish: Literal["stop", "length", "abort"]
    text: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    server_version: int | None = None  # the weights version the server says made these tokens
    token_versions: list[int | None] | None = None  # per token, when the server lists them (asearch engine serve)


@dataclass(slots=True)
class RemoteEngineStats:
    """Counters since the engine was made."""

    requests: int = 0  # generate() calls
    chunks: int = 0  # server calls (a resend is one more chunk)
    resends: int = 0  # chunks sent again after an abort
    unsplit_spans: int = 0  # chunks an in-place update landed in, the server not saying where: send-time version
    weight_updates: int = 0
    last_update_s: float = 0.0


class ResumableRemoteEngine:
    """Core of an `Engine` over token-in/token-out servers that can abort requests mid-generation.

    A request goes to one server, chosen by a stable hash of `trajectory_id` (turns of a trajectory hit
    the same server's prefix cache). It is sent in chunks: when the server aborts it (a weight update),
    the prompt plus the tokens so far is resent with the remaining token budget, so the prefix is
    re-prefilled under the new weights and one response may carry two versions.

    Each token is tagged with the version read when its chunk was *sent* (or the version the server
    reports having used), never one read after the round trip: that was AReaL's race. Subclasses make
    the weights change only while no chunk sent under the old version is still running, unless they
    update in place (`updates_in_place`): then a chunk an update landed in takes each token's version from
    the server when it lists them, else the send-time version for all (older is the safe side of the bound).
    """

    updates_in_place = False

    what = "server"

    def __init__(
        self, urls: Sequence[str], *, http: HttpConfig, max_resends: int, initial_version: int = 0
    ) -> None:
        if not urls:
            raise ValueError(f"{type(self).__name__} needs at least one base_url")
        self.stats = RemoteEngineStats()
        self.max_resends = max_resends
        self._servers = [JsonHttpClient(u, cfg=http, what=f"{self.what} {u}") for u in urls]
        self._version = initial_version
        self._admit = asyncio.Event()  # set: new chunks may be sent
        self._admit.set()
        self._user_paused = False
        self._closing = False
        self._inflight = 0
        self._drained = asyncio.Event()  # set whenever no chunk is in flight
        self._drained.set()
        self._update_lock = asyncio.Lock()
        self._updating = False
        self._sem = asyncio.Semaphore(http.max_concurrency)

    # ------------------------------------------------------------------ to implement

    async def _send_chunk(
        self,
        server: JsonHttpClient,
        request: GenerateRequest,
        prompt: list[int],
        max_tokens: int,
        attempt: int,
    ) -> Chunk:
        raise NotImplementedError

    # ------------------------------------------------------------------ Engine protocol (shared part)

    @property
    def version(self) -> int:
        return self._version

    @property
    def base_urls(self) -> list[str]:
        return [s.base_url for s in self._servers]

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        if not request.input_ids:
            raise ValueError(
                f"{type(self).__name__} needs GenerateRequest.input_ids (non-empty); "
                "for chat messages use OpenAIChatEngine"
            )
        max_new = request.sampling.max_new_tokens
        server = self._route(request)
        out_ids: list[int] = []
        out_lps: list[float] = []
        out_vers: list[int] = []
        texts: list[str] = []
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        stop_reason: StopReason = "abort"
        start = time.monotonic()
        self.stats.requests += 1
        for attempt in range(self.max_resends + 1):
            remaining = max_new - len(out_ids)
            if remaining <= 0:
                stop_reason = "length"
                break
            prompt = list(request.input_ids) + out_ids
            async with self._sem:
                # Re-check after waking: an update may have closed the gate again before we ran. From
                # here to `_inflight += 1` there is no await, so an update either sees this chunk in
                # flight or closed the gate before it was sent.
                while not self._admit.is_set():
                    await self._admit.wait()
                if self._closing:
                    break
                version = self._version  # fixed at send time
                self._inflight += 1
                self._drained.clear()
                try:
                    self.stats.chunks += 1
                    chunk = await self._send_chunk(server, request, prompt, remaining, attempt)
                except RemoteError:
                    if self._closing:
                        break
                    raise
                finally:
                    self._inflight -= 1
                    if self._inflight == 0:
                        self._drained.set()
            tag = chunk.server_version if chunk.server_version is not None else version
            out_ids += chunk.ids
            out_lps += chunk.logprobs
            if chunk.token_versions is not None:  # the server named each token's weights
                out_vers += [version if v is None else v for v in chunk.token_versions]
            elif self.updates_in_place and self._version != version:
                self.stats.unsplit_spans += 1
                out_vers += [version] * len(chunk.ids)
            else:
                out_vers += [tag] * len(chunk.ids)
            texts.append(chunk.text)
            usage["prompt_tokens"] += chunk.prompt_tokens
            usage["completion_tokens"] += chunk.completion_tokens
            if chunk.finish != "abort":
                stop_reason = chunk.finish
                break
            if attempt < self.max_resends:
                self.stats.resends += 1
        else:
            log.warning(
                "request %s still aborted after %d resends; returning it as 'abort'",
                request.request_id,
                self.max_resends,
            )
        return GenerateResponse(
            output_ids=out_ids,
            output_logprobs=out_lps,
            output_versions=out_vers,
            stop_reason=stop_reason,
            text="".join(texts),
            input_len=len(request.input_ids),
            latency_s=time.monotonic() - start,
            usage=usage,
        )

    async def close(self) -> None:
        """Stop sending; calls still in flight end with stop_reason 'abort'. Does not stop the servers."""
        self._closing = True
        self._admit.set()  # wake waiters so they see `_closing`
        for s in self._servers:
            await s.aclose()

    async def health(self) -> list[bool]:
        """GET /health on each server (no retries)."""
        out = []
        for s in self._servers:
            try:
                await s.request("GET", "/health", retries=0)
                out.append(True)
            except RemoteError:
                out.append(False)
        return out

    # ------------------------------------------------------------------ helpers for subclasses

    def _route(self, request: GenerateRequest) -> JsonHttpClient:
        key = request.trajectory_id or request.request_id
        return self._servers[zlib.crc32(key.encode()) % len(self._servers)]

    def _open_gate(self) -> None:
        """Admit new chunks again, unless the user paused, an update is running, or we are closing."""
        if not self._user_paused and not self._updating and not self._closing:
            self._admit.set()

    def _record_update(self, version: int, start: float, source: Path) -> None:
        self._version = version
        self.stats.weight_updates += 1
        self.stats.last_update_s = time.monotonic() - start
        log.info(
            "%s weights -> version %d from %s in %.2fs", self.what, version, source, self.stats.last_update_s
        )

    async def _wait_drained(self, timeout_s: float, abort_on_servers: str | None = None) -> None:
        """Wait until no chunk is in flight. With `abort_on_servers` (an endpoint), keep POSTing it to
        every server meanwhile: a chunk that reached a paused server only after the pause is queued
        there and would otherwise run, under the new weights, with an old-version tag."""
        deadline = time.monotonic() + timeout_s
        while self._inflight:
            if time.monotonic() > deadline:
                raise RemoteError(
                    f"{self._inflight} {self.what} call(s) still in flight {timeout_s:g}s after pausing for "
                    "a weight update; check the server log, or raise drain_timeout_s."
                )
            if abort_on_servers:
                for s in self._servers:
                    await s.post_json(abort_on_servers, {}, retries=1)
            try:
                async with asyncio.timeout(0.2):  # not wait_for: on 3.11 it can swallow a cancel
                    await self._drained.wait()
            except TimeoutError:
                pass


def check_weights_dir(source: WeightSource) -> Path:
    """The HF directory a remote server should load; rejects bad paths here, before a server sees them
    (a bad path makes vLLM's engine core die mid-reload)."""
    if isinstance(source, Mapping):
        raise TypeError(
            "remote engines load weights from a directory: save the state dict with "
            "model.save_pretrained(dir) and pass dir"
        )
    path = Path(os.fspath(source)).resolve()
    if not path.is_dir():
        raise ValueError(f"weights directory {path} does not exist")
    if not (path / "config.json").is_file():
        raise ValueError(f"{path} has no config.json: not an HF model directory")
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        raise ValueError(f"{path} has no *.safetensors or *.bin weight files")
    return path


def ties_embeddings(path: Path) -> bool:
    """Whether the HF model in `path` shares its input embedding with the LM head."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path / 'config.json'}: unreadable ({e})") from e
    text_cfg = cfg.get("text_config") or {}
    return bool(cfg.get("tie_word_embeddings", text_cfg.get("tie_word_embeddings", False)))
