"""The engine seam: plain request/response records and the `Engine` protocol every backend implements.

Tokens in, tokens out: a response carries the sampled ids, the log-probability of each under the
sampling distribution, and the policy version that produced each token (fixed when sent).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

StopReason = Literal["stop", "length", "abort"]


@dataclass(slots=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_new_tokens: int = 256
    stop: list[str] = field(default_factory=list)  # stop strings (output includes the stop string)
    stop_token_ids: list[int] = field(default_factory=list)  # e.g. eos; the stop token is included
    seed: int | None = None


@dataclass(slots=True)
class GenerateRequest:
    """One generation call. `input_ids` for token engines; `messages` for chat-only endpoints."""

    input_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    trajectory_id: str = ""  # kept across turns of one trajectory so a server can reuse its KV cache
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass(slots=True)
class GenerateResponse:
    output_ids: list[int]
    output_logprobs: list[float]  # log-prob of each sampled token under the sampling distribution
    output_versions: list[int]  # policy version that produced each token
    stop_reason: StopReason
    text: str = ""  # decoded output (always set by chat engines; token engines may set it)
    input_len: int = 0
    latency_s: float = 0.0
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens / completion_tokens when known

    @property
    def output_len(self) -> int:
        return len(self.output_ids)


# A weight source: a directory of HF safetensors, or an in-memory state dict (same process).
WeightSource = str | os.PathLike[str] | Mapping[str, Any]

# What a weight update does to the KV cache of requests in flight and of cached prefixes.
UpdateKV = Literal["recompute", "keep"]
UPDATE_KV_HELP = (
    "KV cache at a weight update. keep (the default): requests go on with the KV the old weights computed and "
    "prefixes stay cached (PipelineRL's in-flight update: no re-prefill; tokens after the update carry the new "
    "version); recompute: in-flight requests recompute theirs under the new weights (an HTTP server aborts "
    "them and they are resent with their tokens so far) and cached prefixes are dropped"
)


@runtime_checkable
class Engine(Protocol):
    """What the agent loop and the RL controller need from any inference backend.

    `update_weights` does not fail in-flight requests: they go on under the new weights, so one response
    may carry tokens of two versions. With `update_kv=keep` (the default) they keep the KV the old weights
    computed and cached prefixes stay; with `recompute` their prefix is recomputed (see `UPDATE_KV_HELP`).
    A request only ends with stop_reason "abort" when it was cancelled or the engine is closing.
    """

    @property
    def version(self) -> int: ...

    async def generate(self, request: GenerateRequest) -> GenerateResponse: ...

    async def pause(self) -> None:
        """Stop admitting new decode steps (in-flight requests wait, they are not lost)."""
        ...

    async def resume(self) -> None: ...

    async def update_weights(self, source: WeightSource, version: int) -> None: ...

    async def close(self) -> None: ...


class Tokenizer(Protocol):
    """The part of a HF tokenizer every caller uses: text to ids and back, and the end-of-text id."""

    @property
    def eos_token_id(self) -> int | None: ...

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], /, *, skip_special_tokens: bool = ...) -> str: ...


class ChatTokenizer(Tokenizer, Protocol):
    """A tokenizer with a chat template (HF's): callers holding a `Tokenizer` check `chat_template` first."""

    @property
    def chat_template(self) -> str | None: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...
