"""The in-process engine: continuous batching over a slot KV cache in a dedicated decode thread.

Every decode step batches all active requests; new requests are prefilled between steps and join the
batch, finished ones leave it. `update_weights` swaps weights between two steps; in-flight requests go on
with the KV cache the old weights computed (`update_kv: keep`, as PipelineRL's in-flight updates do) or
recompute it under the new ones (`recompute`), so one response may carry two versions.
The asyncio side only enqueues commands and awaits futures: the event loop never runs torch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import Field

from asearch.config import Config
from asearch.engine.registry import register_engine
from asearch.engine.types import (
    UPDATE_KV_HELP,
    GenerateRequest,
    GenerateResponse,
    StopReason,
    UpdateKV,
    WeightSource,
)
from asearch.models.device import DEVICE_HELP, DTYPE_HELP, DTypeName

# torch and the decoder are imported where they are used: listing the engine kinds imports this module
if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from asearch.engine.local.decoder import DecoderWeights, DecoderWeightsBuilder
    from asearch.engine.local.sampling import RowSampling
    from asearch.engine.registry import EngineConfig

log = logging.getLogger(__name__)


class InProcessEngineConfig(Config):
    """Knobs of the in-process engine. Defaults suit the CPU demo (tiny model, 64 concurrent episodes)."""

    threads: int = Field(
        1, ge=1, description="torch intra-op threads of the decode thread (1 on a shared 2-core box)"
    )
    max_batch: int = Field(64, ge=1, description="requests decoded together; more wait in a FIFO queue")
    max_seq_len: int = Field(
        2048,
        ge=2,
        description="prompt + output tokens per request (also capped by the model's max positions)",
    )
    prefill_chunk: int = Field(
        512,
        ge=1,
        le=65536,
        description="most prompt tokens one request prefills per step; longer prompts span steps",
    )
    max_prefill_tokens: int = Field(
        8192, ge=1, description="padded tokens (rows x chunk) per prefill forward; bounds activation memory"
    )
    device: str = Field("auto", description=f"where the model decodes: {DEVICE_HELP}")
    dtype: DTypeName = Field(
        "auto",
        description=f"weights, activations and KV cache: {DTYPE_HELP}; float32 is the fast one on CPUs without "
        "bf16 units",
    )
    prefix_cache_mb: float = Field(
        256.0,
        ge=0,
        description="KV of finished requests kept per trajectory_id so the next turn prefills only its new "
        "tokens; LRU, dropped on weight update unless update_kv is keep; 0 disables",
    )
    update_kv: UpdateKV = Field("keep", description=UPDATE_KV_HELP)
    seed: int = Field(
        0, description="seeds the per-request random streams of requests without their own seed"
    )
    cuda_graphs: bool | Literal["auto"] = Field(
        "auto",
        description="replay the decode step as CUDA graphs, one per batch-size and context-length bucket "
        "(captured on first use; removes the per-kernel launch cost); auto: on when the device is CUDA; "
        "ignored on other devices",
    )
    cpu_kernels: Literal["auto", "native", "torch"] = Field(
        "auto",
        description="the decode step's attention (with RoPE and the K/V write), RMS norms and sampler on the CPU "
        "in float32: "
        "native: C kernels (asearch/engine/local/cpu_kernels.c) built at first use by the system C compiler; torch: "
        "torch's ops; auto: native where they build, else torch (native errors instead); ignored on other "
        "devices and dtypes",
    )


# --------------------------------------------------------------------------- per-request state


@dataclass(eq=False, slots=True)
class _Row:
    """One request while it is queued or decoding; owned by the decode thread after submission."""

    req: GenerateRequest
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[GenerateResponse]
    tokens: list[int]  # prompt + output so far; the last one is not yet in the KV cache while decoding
    prompt_len: int
    sampling: RowSampling
    max_new: int
    stop_ids: frozenset[int]
    stop_strs: list[str]
    stop_window: int  # trailing output tokens to decode when checking stop strings
    t0: float
    # token ids that may complete one of stop_strs (None: any may); set by the decode thread on admission
    stop_candidates: frozenset[int] | None = None
    cached: int = 0  # tokens[:cached] have K/V in this row's slot under the current weights
    reused: int = 0  # prompt tokens whose K/V came from the prefix cache
    out_ids: list[int] = field(default_factory=list)
    out_logprobs: list[float] = field(default_factory=list)
    out_versions: list[int] = field(default_factory=list)
    on_token: Callable[[int, float], None] | None = None  # called on `loop` with each sampled (id, log-prob)


@dataclass(slots=True)
class _Parked:
    """K/V of a finished request, kept so the next turn of the same trajectory skips its prefill."""

    tokens: list[int]
    kv: list[torch.Tensor]  # per layer (2, kv_heads, n, head_dim)
    nbytes: int


@dataclass(slots=True)
class _Stats:
    started: float = field(default_factory=time.perf_counter)
    idle_s: float = 0.0
    steps: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0
    recomputed_tokens: int = 0
    prefix_reused_tokens: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    prompts_too_long: int = 0
    weight_updates: int = 0


# --------------------------------------------------------------------------- the engine


class InProcessEngine:
    """An `Engine` that decodes a Llama/Qwen2/Qwen3 model in this process, on the CPU or one GPU.

    The engine snapshots the model's weights at construction (later changes to `model` do not leak
    in; push them with `update_weights`). `tokenizer` is needed for stop strings, `messages` requests
    and the `text` field; token-only use works without one.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        cfg: InProcessEngineConfig | None = None,
        version: int = 0,
    ):
        import torch

        from asearch.engine.local.cpu_kernels import kernels_for
        from asearch.engine.local.decoder import DecodeGraphs, DecoderSpec, DecoderWeights, RoPE, SlotKVCache
        from asearch.models.device import resolve_device, resolve_dtype
        from asearch.models.lora import base_model, merged_state_dict

        self.cfg = cfg or InProcessEngineConfig()
        self.tokenizer = tokenizer
        self.config = model.config
        self.spec = DecoderSpec.from_config(model.config)
        self.device = resolve_device(self.cfg.device)
        self._dtype = resolve_dtype(self.cfg.dtype, self.device)
        self.max_seq_len = min(self.cfg.max_seq_len, self.spec.max_positions)
        self._spare_weights: list[DecoderWeights] = []  # CPU: the previous version's tensors, for the next build
        self._kernels = kernels_for(self.cfg.cpu_kernels, self.device, self._dtype)
        self._transpose = self._kernels.transpose_into if self._kernels is not None else None
        with torch.inference_mode():
            self._weights = DecoderWeights.from_state_dict(
                self.spec, merged_state_dict(model), self._dtype, self.device, transpose=self._transpose
            )
            rotary = base_model(model).model.rotary_emb
            self._rope = RoPE(
                rotary.inv_freq, float(rotary.attention_scaling), self.max_seq_len, self._dtype, self.device
            )
            graphs = _graphs_wanted(self.cfg.cuda_graphs, self.device)
            self._cache = SlotKVCache(
                self.spec, self._dtype, self.cfg.max_batch, self.max_seq_len, self.device, spare_slot=graphs
            )
        self._decode_attention = self._kernels.decode_attention(self.spec) if self._kernels is not None else None
        # CUDA: decode runs on a stream of its own (high priority: a step waits on it), after what the constructor queued
        self._stream = torch.cuda.Stream(self.device, priority=-1) if self.device.type == "cuda" else None
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))
        self._graphs = (
            DecodeGraphs(self.spec, self._rope, self._cache, self.cfg.max_batch, stream=self._stream) if graphs else None
        )
        self._token_texts: list[str | None] | None = None  # per token id, for the stop-string pre-check
        self._stop_candidate_sets: dict[frozenset[str], frozenset[int] | None] = {}
        self._version = version
        self._seed_rng = random.Random(self.cfg.seed)
        self._commands: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._rows: list[_Row] = []  # active, slot i == index i (kept compact)
        self._waiting: collections.deque[_Row] = collections.deque()
        self._parked: collections.OrderedDict[str, _Parked] = collections.OrderedDict()
        self._parked_bytes = 0
        self._paused = False
        self._closed = False
        self._stats = _Stats()
        self._thread = threading.Thread(target=self._run, name="asearch-inprocess-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        cfg: InProcessEngineConfig | None = None,
        version: int = 0,
    ) -> InProcessEngine:
        """Load model and tokenizer by HF name, directory or built-in alias (see `asearch.models.loading`)."""
        from asearch.models.loading import load_model, load_tokenizer

        cfg = cfg or InProcessEngineConfig()
        # loaded in float32 on the CPU: the engine copies the weights into its own layout, device and dtype
        return cls(load_model(name_or_path), load_tokenizer(name_or_path), cfg=cfg, version=version)

    # ----------------------------------------------------------------------- Engine protocol

    @property
    def version(self) -> int:
        return self._version

    async def generate(
        self, request: GenerateRequest, *, on_token: Callable[[int, float], None] | None = None
    ) -> GenerateResponse:
        """Decode one request; cancelling the awaiting task aborts it and frees its slot.

        `on_token(id, logprob)` runs on the caller's event loop for each token as it is sampled, before the
        response is delivered (a streaming server sends text as it comes).
        """
        if self._closed:
            raise RuntimeError("engine is closed")
        loop = asyncio.get_running_loop()
        row = self._make_row(request, loop)
        row.on_token = on_token
        if row.prompt_len >= self.max_seq_len or row.max_new == 0:
            if row.prompt_len >= self.max_seq_len:
                self._stats.prompts_too_long += 1
                log.warning(
                    "prompt of %d tokens >= max_seq_len %d: nothing generated",
                    row.prompt_len,
                    self.max_seq_len,
                )
            return self._response(row, "length")
        self._commands.put(("add", row))
        try:
            return await row.fut
        except asyncio.CancelledError:
            self._commands.put(("abort", row))
            raise

    async def pause(self) -> None:
        """After this returns no decode step runs until `resume`; requests stay queued, none is lost."""
        await self._call("pause")

    async def resume(self) -> None:
        await self._call("resume")

    def weight_builder(self) -> DecoderWeightsBuilder:
        """An empty set of weights of this engine's layout, dtype and device, to fill tensor by tensor while
        generation goes on (a weight broadcast); `update_weights(builder.finish(), ...)` then only swaps."""
        from asearch.engine.local.decoder import DecoderWeightsBuilder

        return DecoderWeightsBuilder(
            self.spec, self._dtype, self.device, reuse=self._take_spare_weights(), transpose=self._transpose
        )

    async def update_weights(
        self, source: WeightSource | DecoderWeights, version: int, *, kv: UpdateKV | None = None
    ) -> None:
        """Load new weights between two decode steps; in-flight requests continue under them.

        `source` is a state dict (its tensors are copied before this returns, so the trainer may change
        them right after), an HF safetensors directory, or weights from `weight_builder` (taken as they
        are). `kv` (default `cfg.update_kv`): "recompute" recomputes every in-flight request's KV cache
        (prompt + tokens so far) under the new weights before its next token and drops the prefix cache;
        "keep" keeps both, so the next tokens attend to keys and values the old weights computed. Either
        way every token sampled after this carries `version`.
        """
        kv = kv or self.cfg.update_kv
        if kv not in ("recompute", "keep"):
            raise ValueError(f"update_weights: kv must be 'recompute' or 'keep', not {kv!r}")
        await self._call("update", source, version, kv)

    async def abort_all(self) -> int:
        """End every queued and running request now with stop_reason "abort" and the tokens it has.

        Their awaiting callers get a response (not `CancelledError`); the number ended is returned. A
        server uses this to empty the engine before a weight update that its client resends across.
        """
        return await self._call("abort_all")

    async def flush_cache(self) -> None:
        """Drop the prefix cache (KV kept per trajectory between turns)."""
        await self._call("flush")

    async def close(self) -> None:
        """Stop the decode thread; requests still in flight get stop_reason "abort"."""
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            await self._call("close")
            await asyncio.to_thread(self._thread.join)

    def stats(self) -> dict[str, float | int | str]:
        """Throughput counters since construction (approximate while the thread runs)."""
        s = self._stats
        wall = max(time.perf_counter() - s.started, 1e-9)
        return {
            "version": self._version,
            "active": len(self._rows),
            "waiting": len(self._waiting),
            "tokens_generated": s.tokens_generated,
            "decode_steps": s.steps,
            "mean_batch_size": s.tokens_generated / s.steps if s.steps else 0.0,
            "prefill_tokens": s.prefill_tokens,
            "recomputed_tokens": s.recomputed_tokens,
            "prefix_reused_tokens": s.prefix_reused_tokens,
            "requests_finished": s.requests_finished,
            "requests_aborted": s.requests_aborted,
            "prompts_too_long": s.prompts_too_long,
            "weight_updates": s.weight_updates,
            "idle_fraction": min(1.0, s.idle_s / wall),
            "uptime_s": wall,
            "kv_cache_mb": self._cache.nbytes() / 2**20,
            "device": str(self.device),
            "prefix_cache_mb": self._parked_bytes / 2**20,
            "cuda_graphs": len(self._graphs) if self._graphs is not None else 0,
        }

    # ----------------------------------------------------------------------- asyncio side helpers

    async def _call(self, name: str, *args: Any) -> Any:
        if not self._thread.is_alive():
            raise RuntimeError("engine thread is not running (engine closed)")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        self._commands.put((name, loop, fut, *args))
        return await fut

    def _make_row(self, req: GenerateRequest, loop: asyncio.AbstractEventLoop) -> _Row:
        from asearch.engine.local.sampling import RowSampling

        sp = req.sampling
        ids = req.input_ids
        if ids is None:
            if req.messages is None or self.tokenizer is None:
                raise ValueError("request needs input_ids (or messages and an engine tokenizer)")
            ids = cast(  # tokenize=True, return_dict=False: one list of ids (HF types the union of its modes)
                list[int],
                self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True, tokenize=True, return_dict=False),
            )
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError(f"request {req.request_id}: input_ids is empty")
        if min(ids) < 0 or max(ids) >= self.spec.vocab_size:
            raise ValueError(
                f"request {req.request_id}: token id out of range [0, {self.spec.vocab_size}): {min(ids)}..{max(ids)}"
            )
        if sp.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {sp.temperature}")
        if not 0.0 < sp.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {sp.top_p}")
        if sp.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {sp.top_k}")
        if sp.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {sp.max_new_tokens}")
        if sp.stop and self.tokenizer is None:
            raise ValueError(f"stop strings {sp.stop!r} need an engine tokenizer")
        stops = [s for s in sp.stop if s]
        seed = sp.seed if sp.seed is not None else self._seed_rng.getrandbits(63)
        return _Row(
            req=req,
            loop=loop,
            fut=loop.create_future(),
            tokens=list(ids),
            prompt_len=len(ids),
            sampling=RowSampling(float(sp.temperature), int(sp.top_k), float(sp.top_p), random.Random(seed)),
            max_new=min(sp.max_new_tokens, self.max_seq_len - len(ids)),
            stop_ids=frozenset(sp.stop_token_ids),
            stop_strs=stops,
            # A stop string of n UTF-8 bytes spans at most n tokens (every token is >= 1 byte); +3 more
            # cover a multi-byte character cut at the window's start.
            stop_window=max((len(s.encode()) for s in stops), default=0) + 3,
            t0=time.perf_counter(),
        )

    def _response(self, row: _Row, reason: StopReason) -> GenerateResponse:
        text = (
            cast(str, self.tokenizer.decode(row.out_ids, skip_special_tokens=False))  # one list: one str
            if self.tokenizer and row.out_ids
            else ""
        )
        return GenerateResponse(
            output_ids=list(row.out_ids),
            output_logprobs=list(row.out_logprobs),
            output_versions=list(row.out_versions),
            stop_reason=reason,
            text=text,
            input_len=row.prompt_len,
            latency_s=time.perf_counter() - row.t0,
            usage={
                "prompt_tokens": row.prompt_len,
                "completion_tokens": len(row.out_ids),
                "cached_prompt_tokens": row.reused,
            },
        )

    # ----------------------------------------------------------------------- decode thread

    @staticmethod
    def _post(
        loop: asyncio.AbstractEventLoop,
        fut: asyncio.Future[Any],
        result: Any = None,
        exc: BaseException | None = None,
    ) -> None:
        def deliver() -> None:
            if fut.done():  # cancelled by its awaiter meanwhile
                return
            if exc is not None:
                fut.set_exception(exc)
            else:
                fut.set_result(result)

        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop was closed: nobody is waiting any more
            pass

    @staticmethod
    def _notify(
        loop: asyncio.AbstractEventLoop, on_token: Callable[[int, float], None], tok: int, lp: float
    ) -> None:
        # Same FIFO as `_post`: every token reaches the caller before the response that ends the request.
        with contextlib.suppress(RuntimeError):  # the loop was closed: nobody is listening any more
            loop.call_soon_threadsafe(on_token, tok, lp)

    def _run(self) -> None:
        import torch

        torch.set_num_threads(self.cfg.threads)
        on_stream = torch.cuda.stream(self._stream) if self._stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), on_stream:
            while True:
                busy = not self._paused and bool(self._rows or self._waiting)
                if not self._handle_commands(block=not busy):
                    return
                if self._paused or not (self._rows or self._waiting):
                    continue
                try:
                    self._step()
                except Exception as e:  # a bug or OOM: fail what is in flight, keep serving new requests
                    log.exception(
                        "in-process engine step failed; failing %d in-flight requests", len(self._rows)
                    )
                    for row in [*self._rows, *self._waiting]:
                        self._post(row.loop, row.fut, exc=e)
                    self._rows.clear()
                    self._waiting.clear()

    def _handle_commands(self, *, block: bool) -> bool:
        """Apply queued commands; wait for one if `block`. False once closed."""
        while True:
            try:
                if block:
                    t = time.perf_counter()
                    cmd = self._commands.get()
                    self._stats.idle_s += time.perf_counter() - t
                    block = False
                else:
                    cmd = self._commands.get_nowait()
            except queue.Empty:
                return True
            name = cmd[0]
            if name == "add":
                self._waiting.append(cmd[1])
            elif name == "abort":
                self._abort(cmd[1])
            else:
                loop, fut, *args = cmd[1:]
                handlers: dict[str, Callable[..., Any]] = {
                    "pause": self._do_pause,
                    "resume": self._do_resume,
                    "update": self._do_update,
                    "abort_all": self._do_abort_all,
                    "flush": self._do_flush,
                    "close": self._do_close,
                }
                handler = handlers[name]
                try:
                    result = handler(*args)
                except Exception as e:
                    self._post(loop, fut, exc=e)
                else:
                    self._post(loop, fut, result)
                if name == "close":
                    return False

    def _do_pause(self) -> None:
        self._paused = True

    def _do_resume(self) -> None:
        self._paused = False

    def _take_spare_weights(self) -> DecoderWeights | None:
        try:
            return self._spare_weights.pop()  # atomic: two builds never share them
        except IndexError:
            return None

    def _do_update(self, source: WeightSource | DecoderWeights, version: int, kv: UpdateKV) -> None:
        import torch

        from asearch.engine.local.decoder import DecoderWeights, load_safetensors_dir

        t = time.perf_counter()
        if self._stream is not None:  # the source may still be being written on another stream
            torch.cuda.synchronize(self.device)
        if isinstance(source, DecoderWeights):
            new = source
        else:
            if isinstance(source, Mapping):
                sd = source
            else:
                path = Path(source)
                if not path.is_dir():
                    raise FileNotFoundError(f"update_weights: {path} is not a directory of safetensors")
                sd = load_safetensors_dir(path)
            spare = self._take_spare_weights()
            new = DecoderWeights.from_state_dict(
                self.spec, sd, self._dtype, self.device, reuse=spare, transpose=self._transpose
            )  # validates first
        old = self._weights
        # Captured graphs read the weights where they are: copy into them (or drop the graphs if the layout changed).
        if self._graphs is None or not self._weights.copy_(new):
            self._weights = new
            if self._graphs is not None:
                self._graphs.clear()
        if self.device.type == "cpu" and self._weights is new:  # nothing reads the old ones now: the next build fills them
            self._spare_weights[:] = [old]
        if self._stream is not None:
            self._stream.synchronize()  # copied: the caller may change its tensors once this returns
        self._version = version
        if kv == "recompute":  # K/V computed by the old weights: recompute on the next step
            for row in self._rows:
                self._stats.recomputed_tokens += row.cached
                row.cached = 0
            self._do_flush()
        self._stats.weight_updates += 1
        log.info(
            "weights updated to version %d in %.2f s; %d in-flight requests %s their KV cache",
            version,
            time.perf_counter() - t,
            len(self._rows),
            "recompute" if kv == "recompute" else "keep",
        )

    def _do_abort_all(self) -> int:
        rows = [*self._rows, *self._waiting]
        for row in rows:
            self._stats.requests_aborted += 1
            self._post(row.loop, row.fut, self._response(row, "abort"))
        self._rows.clear()
        self._waiting.clear()
        return len(rows)

    def _do_flush(self) -> None:
        self._parked.clear()
        self._parked_bytes = 0

    def _do_close(self) -> None:
        self._do_abort_all()
        self._do_flush()

    def _abort(self, row: _Row) -> None:
        if row in self._waiting:
            self._waiting.remove(row)
        elif row in self._rows:
            self._remove(self._rows.index(row))
        else:
            return  # already finished
        self._stats.requests_aborted += 1

    def _remove(self, i: int) -> None:
        """Free slot i, keeping slots compact: the last active row moves into the hole."""
        last = len(self._rows) - 1
        if i != last:
            moved = self._rows[last]
            self._cache.move(last, i, moved.cached)
            self._rows[i] = moved
        self._rows.pop()

    # ----------------------------------------------------------------------- one step

    def _step(self) -> None:
        import torch

        from asearch.engine.local.sampling import sample

        self._admit()
        rows = self._rows
        n_decode = self._decoding_first()
        logits: list[torch.Tensor] = [self._decode_logits(n_decode)] if n_decode else []
        ready = list(range(n_decode))  # rows whose whole sequence is cached after this step's forwards
        self._prefill(n_decode, logits, ready)
        if not ready:
            return
        token_ids, token_lps = sample(
            logits[0] if len(logits) == 1 else torch.cat(logits), [rows[i].sampling for i in ready], kernels=self._kernels
        )
        self._stats.steps += 1
        self._stats.tokens_generated += len(ready)
        finished: list[tuple[int, StopReason]] = []
        version = self._version
        for i, tok, lp in zip(ready, token_ids, token_lps, strict=True):
            row = rows[i]
            row.tokens.append(tok)
            row.out_ids.append(tok)
            row.out_logprobs.append(lp)
            row.out_versions.append(version)
            if row.on_token is not None:
                self._notify(row.loop, row.on_token, tok, lp)
            reason = self._stop_reason(row, tok)
            if reason is not None:
                finished.append((i, reason))
        done: list[tuple[_Row, GenerateResponse]] = []
        for i, reason in sorted(finished, reverse=True):  # descending: compaction never moves a finished row
            row = rows[i]
            done.append((row, self._response(row, reason)))
            self._park(row, i)
            self._remove(i)
        self._stats.requests_finished += len(done)
        for row, response in done:  # after removal, so stats() seen by a woken caller are already current
            self._post(row.loop, row.fut, response)

    def _decoding_first(self) -> int:
        """Put the rows that decode one token this step into slots 0..n-1 (swapping K/V with prefilling rows
        where needed), so one forward runs them all; return n."""
        rows = self._rows
        decoding = [len(r.tokens) - r.cached == 1 for r in rows]
        n = sum(decoding)
        late = (j for j in range(n, len(rows)) if decoding[j])
        for i in range(n):
            if not decoding[i]:
                j = next(late)
                self._cache.swap(i, j, rows[i].cached, rows[j].cached)
                rows[i], rows[j] = rows[j], rows[i]
        return n

    def _decode_logits(self, n: int) -> torch.Tensor:
        """One forward over rows 0..n-1, each decoding its last token: next-token logits (n, vocab)."""
        import torch

        from asearch.engine.local.decoder import forward
        from asearch.engine.local.sampling import host_tensor_to

        tokens = [r.tokens[-1] for r in self._rows[:n]]
        starts = [r.cached for r in self._rows[:n]]
        for r in self._rows[:n]:
            r.cached += 1
        if self._graphs is not None:
            return self._graphs.logits(self._weights, tokens, starts)
        dev = self.device
        return forward(
            self.spec, self._weights, self._rope, self._cache, 0, host_tensor_to(tokens, torch.long, dev)[:, None],
            host_tensor_to(starts, torch.long, dev), None, n_keys=max(starts) + 1,
            decode_attention=self._decode_attention, rms_norm=self._kernels.rms_norm if self._kernels else None,
        )  # fmt: skip

    def _prefill(self, first: int, logits: list[torch.Tensor], ready: list[int]) -> None:
        """Run the next prompt chunk of rows first.. (all prefilling); rows whose prompt is then all cached
        append their next-token logits to `logits` and their index to `ready`."""
        import torch

        from asearch.engine.local.decoder import forward
        from asearch.engine.local.sampling import host_tensor_to

        rows, dev = self._rows, self.device
        if first == len(rows):
            return
        for a, b, width in self._prefill_groups(list(range(first, len(rows)))):
            chunk = [rows[i].tokens[rows[i].cached : rows[i].cached + width] for i in range(a, b)]
            n_real = [len(c) for c in chunk]
            starts = [rows[i].cached for i in range(a, b)]
            out = forward(
                self.spec, self._weights, self._rope, self._cache, a,
                host_tensor_to([c + [0] * (width - len(c)) for c in chunk], torch.long, dev),
                host_tensor_to(starts, torch.long, dev), host_tensor_to(n_real, torch.long, dev),
                n_keys=max(starts) + width,
            )  # fmt: skip
            self._stats.prefill_tokens += sum(n_real)
            done = []
            for j, i in enumerate(range(a, b)):
                rows[i].cached += n_real[j]
                if rows[i].cached == len(rows[i].tokens):
                    done.append(j)
                    ready.append(i)
            if done:
                logits.append(out[host_tensor_to(done, torch.long, dev)] if len(done) < b - a else out)

    def _stop_reason(self, row: _Row, tok: int) -> StopReason | None:
        if tok in row.stop_ids:
            return "stop"
        if row.stop_strs and (row.stop_candidates is None or tok in row.stop_candidates):
            assert self.tokenizer is not None
            tail = self.tokenizer.decode(row.out_ids[-row.stop_window :], skip_special_tokens=False)
            if any(s in tail for s in row.stop_strs):
                return "stop"
        if len(row.out_ids) >= row.max_new:
            return "length"
        return None

    def _stop_candidates(self, stops: list[str]) -> frozenset[int] | None:
        """The token ids after which `stops` must be looked for (None: every one): those whose text contains
        the last character of a stop string, since a stop string that newly appears ends in the new token's
        text, and those whose text is not a plain suffix (part of a UTF-8 character; a decoder that rewrites
        what came before). Built from every token's text once, cached per set of stop strings."""
        key = frozenset(stops)
        if key not in self._stop_candidate_sets:
            texts = self._in_context_texts()
            if not texts or any("\ufffd" in s for s in stops):
                found = None
            else:
                last = {s[-1] for s in stops}
                found = frozenset(
                    [i for i, t in enumerate(texts) if t is None or any(c in t for c in last)]
                    + list(range(len(texts), self.spec.vocab_size))  # ids past the tokenizer's: always checked
                )
            if len(self._stop_candidate_sets) >= 256:
                self._stop_candidate_sets.clear()
            self._stop_candidate_sets[key] = found
        return self._stop_candidate_sets[key]

    def _in_context_texts(self) -> list[str | None]:
        """Each token's text as decoded right after the token "a" (None where that is not "a" + a suffix, or
        holds a replacement character); empty if the tokenizer has no one-token "a"."""
        if self._token_texts is None:
            tok = self.tokenizer
            assert tok is not None
            anchor = tok.encode("a", add_special_tokens=False)
            self._token_texts = []
            if len(anchor) == 1 and tok.decode(anchor) == "a":
                n = min(len(tok), self.spec.vocab_size)
                pairs = tok.batch_decode([[anchor[0], i] for i in range(n)], skip_special_tokens=False)
                self._token_texts = [p[1:] if p.startswith("a") and "\ufffd" not in p else None for p in pairs]
        return self._token_texts

    def _prefill_groups(self, extend: list[int]) -> list[tuple[int, int, int]]:
        rows = self._rows
        return plan_prefill(
            [(i, rows[i].cached, len(rows[i].tokens) - rows[i].cached) for i in extend],
            chunk=self.cfg.prefill_chunk,
            budget=self.cfg.max_prefill_tokens,
            max_len=self.max_seq_len,
        )

    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self.cfg.max_batch:
            row = self._waiting.popleft()
            if row.stop_strs:
                row.stop_candidates = self._stop_candidates(row.stop_strs)
            slot = len(self._rows)
            self._rows.append(row)
            self._reuse_prefix(row, slot)

    # ----------------------------------------------------------------------- prefix cache

    def _park(self, row: _Row, slot: int) -> None:
        tid = row.req.trajectory_id
        if not tid or self.cfg.prefix_cache_mb <= 0 or row.cached == 0:
            return
        n = row.cached
        kv = [buf[slot, :, :, :n].clone() for buf in self._cache.kv]
        nbytes = sum(t.numel() * t.element_size() for t in kv)
        if tid in self._parked:
            self._parked_bytes -= self._parked.pop(tid).nbytes
        self._parked[tid] = _Parked(row.tokens[:n], kv, nbytes)
        self._parked_bytes += nbytes
        limit = self.cfg.prefix_cache_mb * 2**20
        while self._parked and self._parked_bytes > limit:
            _, old = self._parked.popitem(last=False)
            self._parked_bytes -= old.nbytes

    def _reuse_prefix(self, row: _Row, slot: int) -> None:
        tid = row.req.trajectory_id
        parked = self._parked.pop(tid, None) if tid else None
        if parked is None:
            return
        self._parked_bytes -= parked.nbytes  # a recomputing update flushed every older entry
        n = _common_prefix(parked.tokens, row.tokens)
        n = min(n, len(row.tokens) - 1)  # at least one token must run to produce the next-token logits
        if n <= 0:
            return
        self._cache.ensure(slot + 1, n)
        for buf, saved in zip(self._cache.kv, parked.kv, strict=True):
            buf[slot, :, :, :n] = saved[:, :, :n]
        row.cached = row.reused = n
        self._stats.prefix_reused_tokens += n


def _graphs_wanted(setting: bool | str, device: torch.device) -> bool:
    """cuda_graphs resolved for `device`: only CUDA has them (true elsewhere is ignored, as documented)."""
    return device.type == "cuda" and setting in (True, "auto")


def plan_prefill(
    rows: list[tuple[int, int, int]], *, chunk: int, budget: int, max_len: int
) -> list[tuple[int, int, int]]:
    """Group (slot, cached, uncached) rows into contiguous padded forwards: (first slot, end slot, width).

    width = the longest chunk in the group (each row runs at most `chunk` tokens). A group never
    exceeds `budget` padded tokens (rows x width) and never pads a row past `max_len` (its start + width),
    since padding is written into the KV cache too.
    """
    groups: list[tuple[int, int, int]] = []
    chunk = min(chunk, budget)
    info = {slot: (cached, min(chunk, need)) for slot, cached, need in rows}
    for a, b in _runs([slot for slot, _, _ in rows]):
        first, width, top = a, 0, 0  # top: the largest start in the current group
        for i in range(a, b):
            start, need = info[i]
            new_width, new_top = max(width, need), max(top, start)
            if i > first and ((i - first + 1) * new_width > budget or new_top + new_width > max_len):
                groups.append((first, i, width))
                first, new_width, new_top = i, need, start
            width, top = new_width, new_top
        groups.append((first, b, width))
    return groups


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Sorted indices -> maximal contiguous [start, end) ranges."""
    out: list[tuple[int, int]] = []
    for i in indices:
        if out and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1)
        else:
            out.append((i, i + 1))
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@register_engine(
    "inprocess",
    options=InProcessEngineConfig,
    summary="the model decoded in this process (continuous batching; CPU or one GPU)",
)
def build_inprocess(cfg: EngineConfig, **context: Any) -> InProcessEngine:
    """Load `cfg.model` (HF name, directory or alias) and its tokenizer into an `InProcessEngine`."""
    return InProcessEngine.from_pretrained(cfg.model, cfg=cfg.options)
