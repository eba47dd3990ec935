"""An inference server for `InProcessEngine` that speaks SGLang's native protocol (the subset RL needs)
and OpenAI's API (`asearch.engine.server.openai_api`).

`asearch engine serve MODEL` (or `launch_engine_server`) runs the in-process engine in its own process
behind the endpoints `asearch.engine.remote.sglang.SGLangEngine` uses, so a trainer talks to it exactly as it
would to an SGLang server: generation and training run in different processes, on different cores, and
weights arrive from disk (`/update_weights_from_disk`) or over a weight group the trainer broadcasts on
(`/init_weights_update_group`, `/update_weights_from_distributed`).

    POST /generate                  {input_ids | text, sampling_params, return_logprob, rid}
    POST /pause_generation          {mode: abort | in_place | retract}
    POST /continue_generation
    POST /update_weights_from_disk  {model_path, weight_version?, abort_all_requests?, flush_cache?}
    POST /init_weights_update_group {master_address, master_port, rank_offset, world_size, group_name, backend}
    POST /update_weights_from_distributed  {names, dtypes, shapes, group_name, weight_version? (last bucket), ...}
    POST /destroy_weights_update_group  {group_name}      (collective weight sync: asearch.engine.weight_group)
    POST /flush_cache  GET /health  GET /get_model_info  GET /get_server_info
    POST /v1/chat/completions  POST /v1/completions  GET /v1/models   (OpenAI's API, see openai_api)

Versions stay exact. An update either empties the engine first (running requests are aborted and return
the tokens they have, or finish; the client resends aborted requests with their tokens so far) or, while
paused in place, swaps the weights under the frozen requests (with `flush_cache: false` they keep the KV
the old weights computed and the prefix cache stays: PipelineRL's in-flight update). New requests wait
until the new weights are loaded. `meta_info.weight_version` names the weights of a response's last
token, and with `return_logprob` each token's is listed too (`output_token_weight_versions`).
Both protocols go through `EngineServer.run`: the same gate, prefix index and engine batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from asearch.engine.server.openai_api import APIError, json_body, mount_openai_api
from asearch.engine.supervisor import ServerSupervisor, SupervisorConfig
from asearch.engine.types import GenerateRequest, GenerateResponse, SamplingParams
from asearch.errors import ConfigError

if TYPE_CHECKING:
    from asearch.engine.local.inprocess import InProcessEngine, InProcessEngineConfig
    from asearch.engine.weight_group import WeightGroup

log = logging.getLogger(__name__)

PAUSE_MODES = ("abort", "in_place", "retract")


class PrefixIndex:
    """Finds which finished request a new prompt continues, so its KV cache can be reused.

    SGLang requests carry no trajectory id; SGLang's radix cache matches prefixes instead. This index
    does the same for the engine's per-trajectory prefix cache: every finished request is remembered by
    (length, hash) of the tokens the engine keeps (prompt + output minus the last token), and a new
    prompt looks up the longest of them that it starts with. A hash collision costs nothing but a miss:
    the engine compares the actual tokens before it reuses any KV.
    """

    _MOD = (1 << 61) - 1
    _BASE = 1_000_003

    def __init__(self, max_entries: int = 8192):
        self.max_entries = max_entries
        self._by_key: dict[tuple[int, int], str] = {}
        self._by_id: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._lengths: dict[int, int] = {}  # stored length -> how many entries have it

    def __len__(self) -> int:
        return len(self._by_id)

    def lookup(self, tokens: Sequence[int]) -> str | None:
        """The id of the longest stored sequence that `tokens` starts with, if any."""
        if not self._lengths:
            return None
        best: str | None = None
        h, mod, base, lengths, keys = 0, self._MOD, self._BASE, self._lengths, self._by_key
        longest = max(lengths)
        for i, t in enumerate(tokens, 1):
            if i > longest:
                break
            h = (h * base + t + 1) % mod
            if i in lengths:
                best = keys.get((i, h), best)
        return best

    def store(self, key_id: str, tokens: Sequence[int]) -> None:
        self.drop(key_id)
        if not tokens:
            return
        h = 0
        for t in tokens:
            h = (h * self._BASE + t + 1) % self._MOD
        key = (len(tokens), h)
        old = self._by_key.get(key)
        if old is not None:
            self.drop(old)
        self._by_key[key] = key_id
        self._by_id[key_id] = key
        self._lengths[key[0]] = self._lengths.get(key[0], 0) + 1
        while len(self._by_id) > self.max_entries:
            self.drop(next(iter(self._by_id)))

    def drop(self, key_id: str) -> None:
        key = self._by_id.pop(key_id, None)
        if key is None:
            return
        del self._by_key[key]
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]

    def clear(self) -> None:
        self._by_key.clear()
        self._by_id.clear()
        self._lengths.clear()


class BadRequest(APIError, ValueError):
    """A request the server refuses with HTTP 400 (in OpenAI's error shape, on every route)."""


class EngineServer:
    """The state behind the HTTP app: the engine, the pause/update gate and the weight-version label."""

    def __init__(
        self,
        engine: InProcessEngine,
        *,
        model_path: str = "",
        weight_version: str = "default",
        eos_token_ids: Sequence[int] = (),
        served_model_name: str | None = None,
    ):
        self.engine = engine
        self.model_path = model_path
        self.served_model_name = served_model_name or model_path  # the `model` of OpenAI requests
        self.weight_version = weight_version
        self.eos_token_ids = [int(t) for t in eos_token_ids]
        self.paused: str | None = None  # None or the /pause_generation mode
        self.updating = False
        self.prefix = PrefixIndex()
        self.started = time.time()
        self.counts = {"requests": 0, "aborted_by_pause": 0, "aborted_by_update": 0, "weight_updates": 0}
        self._labels = {engine.version: weight_version}  # engine version -> the weight_version it was given
        self._gate = asyncio.Event()  # set: new requests may enter the engine
        self._gate.set()
        self._inflight = 0  # requests inside the engine
        self._idle = asyncio.Event()
        self._idle.set()
        self._frozen = asyncio.Event()  # set while paused in place or retract
        self._live: set[str] = set()  # prefix-cache ids of requests inside the engine
        self._next_id = 0
        self._update_lock = asyncio.Lock()
        self._groups: dict[str, WeightGroup] = {}  # weight-broadcast groups joined (init_weights_update_group)
        self._received: dict[str, Any] = {}  # per group: the update being received (a weight builder or a dict)

    # ------------------------------------------------------------------ generation

    async def generate(self, body: Mapping[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
        if body.get("stream"):
            raise BadRequest("stream=true is not supported: send stream=false")
        ids = body.get("input_ids")
        if ids is None and body.get("text") is not None:
            tok = self.engine.tokenizer
            if tok is None:
                raise BadRequest("this server has no tokenizer: send input_ids")
            texts = body["text"]
            ids = [tok.encode(t) for t in texts] if isinstance(texts, list) else tok.encode(texts)
        if ids is None:
            raise BadRequest("a /generate request needs input_ids or text")
        if ids and isinstance(ids[0], list):  # a batch: answer a list, like SGLang
            sps = body.get("sampling_params") or {}
            rids = body.get("rid")
            rids = rids if isinstance(rids, list) and len(rids) == len(ids) else [None] * len(ids)
            return list(
                await asyncio.gather(
                    *(
                        self._generate_one(p, sps[i] if isinstance(sps, list) else sps, rids[i], body)
                        for i, p in enumerate(ids)
                    )
                )
            )
        return await self._generate_one(ids, body.get("sampling_params") or {}, body.get("rid"), body)

    async def _generate_one(
        self, ids: Any, sp: Mapping[str, Any], rid: str | None, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        sampling, no_stop_trim = self._sampling(sp)
        rid = rid or f"req-{self._new_id()}"
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise BadRequest("input_ids must be a list of integers")
        t0 = time.perf_counter()
        resp, label = await self.run(ids, sampling, rid=rid)
        return self._answer(rid, resp, sampling, no_stop_trim, label, body, time.perf_counter() - t0)

    async def run(
        self,
        ids: list[int],
        sampling: SamplingParams,
        *,
        rid: str = "",
        on_token: Callable[[int, float], None] | None = None,
    ) -> tuple[GenerateResponse, str]:
        """Generate through the pause/update gate: (the engine's response, the weight-version label of its
        last token; `token_labels` gives each token's). Prefixes of finished requests are reused; `on_token`
        is passed to the engine (it must stream, as `InProcessEngine` does). A prompt the engine refuses
        raises `BadRequest`."""
        self.counts["requests"] += 1
        while not self._gate.is_set():  # paused or updating: wait, like SGLang's is_pause_cond
            await self._gate.wait()
        # From here to the engine's queue there is no await: a pause or an update that starts later
        # sees this request in flight (and aborts or drains it); one that started earlier held it above.
        key = self.prefix.lookup(ids)
        if key is None or key in self._live:
            key = f"s{self._new_id()}"
        label = self.weight_version
        self._live.add(key)
        self._inflight += 1
        self._idle.clear()
        request = GenerateRequest(input_ids=ids, sampling=sampling, trajectory_id=key)
        try:
            if on_token is None:
                resp = await self.engine.generate(request)
            else:
                resp = await self.engine.generate(request, on_token=on_token)
        except ValueError as e:
            raise BadRequest(str(e)) from e
        finally:
            self._live.discard(key)
            self._inflight -= 1
            if not self._inflight:
                self._idle.set()
        if resp.stop_reason != "abort" and resp.output_ids:
            self.prefix.store(key, [*ids, *resp.output_ids][:-1])
        if resp.output_versions:  # an update in place may have landed mid-request
            label = self._labels.get(resp.output_versions[-1], label)
        return resp, label

    def token_labels(self, resp: GenerateResponse) -> list[str] | None:
        """Each token's weight_version label: the client cannot tell from one label whether an update in place
        landed inside the request."""
        return [self._labels.get(v, self.weight_version) for v in resp.output_versions]

    def _sampling(self, sp: Mapping[str, Any]) -> tuple[SamplingParams, bool]:
        try:
            top_k = int(sp.get("top_k", -1))
            stop = sp.get("stop") or []
            stop = [stop] if isinstance(stop, str) else [str(s) for s in stop]
            stop_ids = [int(t) for t in (sp.get("stop_token_ids") or [])]
            if not sp.get("ignore_eos", False):
                stop_ids += [t for t in self.eos_token_ids if t not in stop_ids]
            if float(sp.get("min_p", 0.0) or 0.0) > 0:
                raise BadRequest("min_p is not supported")
            for penalty in ("frequency_penalty", "presence_penalty"):
                if float(sp.get(penalty, 0.0) or 0.0) != 0.0:
                    raise BadRequest(f"{penalty} is not supported")
            if float(sp.get("repetition_penalty", 1.0) or 1.0) != 1.0:
                raise BadRequest("repetition_penalty is not supported")
            seed = sp.get("sampling_seed")
            params = SamplingParams(
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=0 if top_k < 0 else top_k,  # SGLang: -1 disables
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                stop=stop,
                stop_token_ids=stop_ids,
                seed=None if seed is None else int(seed),
            )
        except (TypeError, ValueError) as e:
            if isinstance(e, BadRequest):
                raise
            raise BadRequest(f"bad sampling_params: {e}") from e
        return params, bool(sp.get("no_stop_trim", False))

    def _answer(
        self,
        rid: str,
        resp: GenerateResponse,
        sampling: SamplingParams,
        no_stop_trim: bool,
        label: str,
        body: Mapping[str, Any],
        latency: float,
    ) -> dict[str, Any]:
        text = resp.text
        finish: dict[str, Any]
        if resp.stop_reason == "stop":
            last = resp.output_ids[-1] if resp.output_ids else None
            if last is not None and last in sampling.stop_token_ids:
                finish = {"type": "stop", "matched": last}
            else:
                hit = min((s for s in sampling.stop if s in text), key=lambda s: text.index(s), default=None)
                finish = {"type": "stop", "matched": hit}
                if hit is not None and not no_stop_trim:
                    text = text[: text.index(hit)]
        elif resp.stop_reason == "length":
            finish = {"type": "length", "length": len(resp.output_ids)}
        else:
            finish = {"type": "abort", "message": "Abort before sampling", "status_code": None}
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": resp.input_len,
            "completion_tokens": len(resp.output_ids),
            "cached_tokens": resp.usage.get("cached_prompt_tokens", 0),
            "weight_version": label,
            "e2e_latency": latency,
        }
        if body.get("return_logprob") and (labels := self.token_labels(resp)) is not None:
            meta["output_token_weight_versions"] = labels
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [
                [lp, t, None] for lp, t in zip(resp.output_logprobs, resp.output_ids, strict=True)
            ]
        return {"text": text, "output_ids": list(resp.output_ids), "meta_info": meta}

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # ------------------------------------------------------------------ control

    async def pause(self, mode: str) -> None:
        """Hold new requests. abort: end running ones now (they return what they have) and return once
        none runs; in_place / retract: freeze them where they are (the engine keeps their KV)."""
        if mode not in PAUSE_MODES:
            raise BadRequest(f"unknown pause mode {mode!r}; one of {', '.join(PAUSE_MODES)}")
        self.paused = mode
        self._gate.clear()
        if mode == "abort":
            self._frozen.clear()
            await self.engine.resume()  # a frozen request must not outlive an abort-mode pause
            self.counts["aborted_by_pause"] += await self.engine.abort_all()
            await self._idle.wait()
        else:
            await self.engine.pause()
            self._frozen.set()

    async def resume(self) -> None:
        self.paused = None
        self._frozen.clear()
        await self.engine.resume()
        if not self.updating:
            self._gate.set()

    async def update_weights(self, body: Mapping[str, Any]) -> tuple[bool, str]:
        """Load a safetensors directory. Requests running when it arrives are aborted when
        `abort_all_requests` is set; while paused in place (or retract) they stay frozen and go on under the
        new weights (keeping their KV cache and the prefix cache with `flush_cache: false`, recomputing it
        otherwise); else the update waits until they finish. New requests wait until it is done."""
        path = body.get("model_path")
        if not path:
            raise BadRequest("update_weights_from_disk needs model_path")
        return await self._swap_weights(str(path), body, str(path))

    async def _swap_weights(self, source: Any, body: Mapping[str, Any], what: str) -> tuple[bool, str]:
        """Make `source` (a directory or a state dict) the engine's weights through the pause/update gate."""
        keep = body.get("flush_cache", True) is False  # SGLang's default flushes
        async with self._update_lock:
            self.updating = True
            self._gate.clear()
            try:
                if body.get("abort_all_requests"):
                    self.counts["aborted_by_update"] += await self.engine.abort_all()
                await self._until_idle_or_frozen()
                version = self.engine.version + 1
                try:
                    await self.engine.update_weights(source, version, kv="keep" if keep else "recompute")
                except Exception as e:  # noqa: BLE001 - reported to the client, as SGLang does
                    log.warning("weight update from %s failed: %s", what, e)
                    return False, f"Failed to update weights: {type(e).__name__}: {e}"
                if not keep:
                    self.prefix.clear()  # the engine dropped its prefix cache with the old weights
                if body.get("weight_version") is not None:
                    self.weight_version = str(body["weight_version"])
                self._labels[version] = self.weight_version
                if isinstance(source, str):
                    self.model_path = source
                self.counts["weight_updates"] += 1
                log.info("loaded weights %s as weight_version %s", what, self.weight_version)
                return True, "Succeeded to update model weights."
            finally:
                self.updating = False
                if not self.paused:
                    self._gate.set()

    async def init_weights_group(self, body: Mapping[str, Any]) -> tuple[bool, str]:
        """Join a trainer's weight-broadcast group (SGLang's /init_weights_update_group) as rank `rank_offset`;
        returns once every member has joined (the trainer joins at the same time)."""
        from asearch.engine.weight_group import open_group

        try:
            name = str(body.get("group_name") or "weights")
            address, port = str(body["master_address"]), int(body["master_port"])
            rank, world = int(body["rank_offset"]), int(body["world_size"])
            backend = str(body.get("backend") or "gloo")
        except (KeyError, TypeError, ValueError) as e:
            raise BadRequest(f"init_weights_update_group: bad body ({e!r})") from e
        if name in self._groups:
            await self.destroy_weights_group({"group_name": name})
        try:
            self._groups[name] = await asyncio.to_thread(
                open_group, address, port, rank, world, group_name=name, backend=backend,
                timeout_s=float(body.get("timeout_s", 600.0)),
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - reported to the client, as SGLang does
            log.warning("init_weights_update_group %s at %s:%s failed: %s", name, address, port, e)
            return False, f"Failed to init group: {type(e).__name__}: {e}"
        log.info("joined weight group %s as rank %d of %d (%s, %s:%d)", name, rank, world, backend, address, port)
        return True, "Succeeded to initialize custom process group."

    async def update_weights_from_group(self, body: Mapping[str, Any]) -> tuple[bool, str]:
        """Receive one bucket (SGLang's /update_weights_from_distributed): the listed tensors, one broadcast
        each, each put in the engine's layout as it arrives while generation goes on; the bucket that carries
        `weight_version` (the last of an update) swaps them in through the same gate as a disk update. A
        broadcast that fails or stalls (a peer died) leaves the group, so its other members fail too."""
        name = str(body.get("group_name") or "weights")
        group = self._groups.get(name)
        if group is None:
            raise BadRequest(f"no weight group {name!r}: call /init_weights_update_group first")
        try:
            names, dtypes, shapes = list(body["names"]), list(body["dtypes"]), [tuple(s) for s in body["shapes"]]
            received = self._received.get(name)
            if received is None:
                received = self._received[name] = self.engine.weight_builder() if hasattr(self.engine, "weight_builder") else {}
            if not isinstance(received, dict):
                received.check(dict(zip(names, shapes, strict=True)))  # before anything is on the wire
        except (KeyError, TypeError, ValueError, ConfigError) as e:
            raise BadRequest(f"update_weights_from_distributed: bad body ({e!r})") from e
        from asearch.engine.weight_group import receive_tensors

        t0 = time.perf_counter()
        try:
            if isinstance(received, dict):  # kept as they come: new tensors
                received.update(await asyncio.to_thread(receive_tensors, group, names, dtypes, shapes, self.engine.device))
            else:  # each copied into the engine's layout as it arrives, from buffers the group reuses
                await asyncio.to_thread(receive_tensors, group, names, dtypes, shapes, self.engine.device, received.put)
            log.info("weight group %s: %d tensors received and placed in %.2fs", name, len(names), time.perf_counter() - t0)
            if body.get("weight_version") is None:
                return True, f"Received {len(names)} tensors."
            del self._received[name]
            weights = received if isinstance(received, dict) else await asyncio.to_thread(received.finish)
        except Exception as e:  # noqa: BLE001 - reported to the client, as SGLang does
            log.warning("weight group %s: receiving failed, leaving the group: %s", name, e)
            await self.destroy_weights_group({"group_name": name})
            return False, f"Failed to receive weights: {type(e).__name__}: {e}"
        return await self._swap_weights(weights, body, f"group:{name}")  # one token: log readers split on spaces

    async def destroy_weights_group(self, body: Mapping[str, Any]) -> None:
        """Leave the group; a receive in progress fails at once (`abort`) rather than waiting for its peers."""
        name = str(body.get("group_name") or "weights")
        self._received.pop(name, None)
        group = self._groups.pop(name, None)
        if group is not None:
            group.abort()
            await asyncio.to_thread(group.close)

    async def _until_idle_or_frozen(self) -> None:
        """Until no request runs, or a pause in place froze them (they cannot finish: update under them)."""
        while not self._idle.is_set() and self.paused in (None, "abort"):
            waits = [asyncio.ensure_future(self._idle.wait()), asyncio.ensure_future(self._frozen.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    async def flush_cache(self) -> None:
        await self.engine.flush_cache()
        self.prefix.clear()

    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "tokenizer_path": self.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.weight_version,
        }

    def server_info(self) -> dict[str, Any]:
        stats = self.engine.stats()
        return {
            **self.model_info(),
            "engine": "asearch.engine.local.inprocess.InProcessEngine",
            "engine_config": self.engine.cfg.model_dump(),
            "paused": self.paused,
            "inflight": self._inflight,
            "uptime_s": time.time() - self.started,
            "process_cpu_s": time.process_time(),
            **self.counts,
            "internal_states": [stats],
        }


def create_app(server: EngineServer) -> FastAPI:
    """The FastAPI app over `server` (SGLang's endpoint names, bodies and answers)."""

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        await server.engine.close()

    app = FastAPI(title="asearch engine server (SGLang protocol, OpenAI API)", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def _bad(_request: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status_code)

    mount_openai_api(app, server)

    @app.post("/generate")
    async def generate(request: Request) -> JSONResponse:
        return JSONResponse(await server.generate(await json_body(request)))

    @app.post("/pause_generation")
    async def pause_generation(request: Request) -> JSONResponse:
        await server.pause(str((await json_body(request)).get("mode", "abort")))
        return JSONResponse({})

    @app.post("/continue_generation")
    async def continue_generation() -> JSONResponse:
        await server.resume()
        return JSONResponse({})

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> JSONResponse:
        ok, message = await server.update_weights(await json_body(request))
        return JSONResponse({"success": ok, "message": message}, status_code=200 if ok else 400)

    @app.post("/init_weights_update_group")
    async def init_weights_update_group(request: Request) -> JSONResponse:
        ok, message = await server.init_weights_group(await json_body(request))
        return JSONResponse({"success": ok, "message": message}, status_code=200 if ok else 400)

    @app.post("/update_weights_from_distributed")
    async def update_weights_from_distributed(request: Request) -> JSONResponse:
        ok, message = await server.update_weights_from_group(await json_body(request))
        return JSONResponse({"success": ok, "message": message}, status_code=200 if ok else 400)

    @app.post("/destroy_weights_update_group")
    async def destroy_weights_update_group(request: Request) -> JSONResponse:
        await server.destroy_weights_group(await json_body(request))
        return JSONResponse({"success": True, "message": "Succeeded to destroy custom process group."})

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache() -> JSONResponse:
        await server.flush_cache()
        return JSONResponse({})

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse({})

    @app.get("/get_model_info")
    async def get_model_info() -> JSONResponse:
        return JSONResponse(server.model_info())

    @app.get("/get_server_info")
    async def get_server_info() -> JSONResponse:
        return JSONResponse(server.server_info())

    return app


def build_server(
    model: str | os.PathLike[str],
    *,
    cfg: InProcessEngineConfig | None = None,
    weight_version: str = "default",
    served_model_name: str | None = None,
) -> EngineServer:
    """Load `model` (a directory, HF name or built-in alias) into an `InProcessEngine` and wrap it;
    OpenAI requests name it `served_model_name` (default: `model` as given)."""
    from asearch.engine.local.inprocess import InProcessEngine

    engine = InProcessEngine.from_pretrained(model, cfg=cfg)
    eos = getattr(engine.tokenizer, "eos_token_id", None)
    return EngineServer(
        engine,
        model_path=str(model),
        weight_version=weight_version,
        eos_token_ids=[] if eos is None else [eos],
        served_model_name=served_model_name,
    )


def run_engine_server(server: EngineServer, *, host: str = "127.0.0.1", port: int = 30000) -> None:
    """Serve until interrupted (uvicorn, one worker: the engine lives in this process)."""
    import uvicorn

    # Keep idle connections open long enough to outlast a training step: a client that reuses one the
    # server has just closed gets a ReadError (retried, but noisy) on its next /generate.
    uvicorn.run(
        create_app(server),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=600,
    )


def engine_server_command(
    model: str | os.PathLike[str],
    *,
    port: int,
    host: str = "127.0.0.1",
    threads: int = 1,
    python: str | None = None,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The `asearch engine serve` command line, run with this interpreter (no console script needed)."""
    serve = [python or sys.executable, "-m", "asearch", "engine", "serve", str(model), f"engine.threads={threads}"]
    return [*serve, "--host", host, "--port", str(port), *extra_args]


def engine_overrides(cfg: InProcessEngineConfig) -> list[str]:
    """`engine.KEY=VALUE` for every in-process option `cfg` sets away from its default (`asearch engine serve`'s
    arguments, as `asearch train` and `eval` take them): the server runs with exactly these options."""
    values = cfg.model_dump(mode="json", exclude_defaults=True)
    return [f"engine.{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in values.items()]


def engine_server_supervisor(
    model: str | os.PathLike[str],
    *,
    log_path: str | os.PathLike[str],
    port: int | None = None,
    host: str = "127.0.0.1",
    threads: int = 1,
    max_batch: int | None = None,
    max_seq_len: int | None = None,
    seed: int | None = None,
    weight_version: str | None = None,
    served_model_name: str | None = None,
    engine: InProcessEngineConfig | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    cfg: SupervisorConfig | None = None,
) -> tuple[ServerSupervisor, str]:
    """The supervisor of `asearch engine serve MODEL` on `host` (loopback by default), not yet started,
    and its base URL: the in-process options of `engine` (all of them: `engine_overrides`), with `max_batch`,
    `max_seq_len` and `seed` over them when given. The child gets OMP_NUM_THREADS=threads (engine.threads).
    """
    from asearch.net import free_port

    port = port or free_port()
    args = [*(engine_overrides(engine) if engine is not None else []), *extra_args]
    for key, value in (("engine.max_batch", max_batch), ("engine.max_seq_len", max_seq_len), ("engine.seed", seed)):
        if value is not None:
            args.append(f"{key}={value}")
    for flag, text in (("--weight-version", weight_version), ("--served-model-name", served_model_name)):
        if text is not None:
            args += [flag, str(text)]
    sup = ServerSupervisor(
        engine_server_command(model, port=port, host=host, threads=threads, extra_args=args),
        f"http://{host}:{port}/health",
        log_path=log_path,
        env={
            "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false",
            **(env or {}),
        },
        cfg=cfg or SupervisorConfig(health_timeout_s=180),
        name=f"engine:{port}",
    )
    return sup, f"http://{host}:{port}"


def launch_engine_server(model: str | os.PathLike[str], **kwargs: Any) -> tuple[ServerSupervisor, str]:
    """Start `asearch engine serve MODEL` as a supervised subprocess (on 127.0.0.1 unless `host=`), wait for /health.

    Returns (supervisor, base_url); talk to it with `SGLangEngine(base_url)`, stop it with `sup.stop()`.
    Keyword arguments as for `engine_server_supervisor`.
    """
    sup, url = engine_server_supervisor(model, **kwargs)
    sup.start()
    return sup, url
