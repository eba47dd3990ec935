"""An engine whose "model" is a Python policy over the decoded prompt: for tests, benchmarks and experts.

The policy sees the prompt text and returns the continuation text; the engine tokenizes it, applies
stop strings and the token budget like a real engine, and reports log-prob 0 (a deterministic policy).
As engine kind `scripted` it plays a fixed list of replies, for dry runs of a config without a model.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from pydantic import Field

from asearch.config import Config
from asearch.engine.registry import register_engine
from asearch.engine.types import GenerateRequest, GenerateResponse, StopReason, Tokenizer, WeightSource

if TYPE_CHECKING:
    from asearch.engine.registry import EngineConfig

Policy = Callable[[str], str]


class ScriptedEngineConfig(Config):
    """Options of engine kind `scripted`: no model, a script of replies (`engine.model` gives the tokenizer)."""

    replies: list[str] = Field(
        default_factory=lambda: ["<answer>unknown</answer>"],
        min_length=1,
        description="The n-th call of each trajectory gets replies[n]; the last one repeats.",
    )


class ScriptedEngine:
    def __init__(self, tokenizer: Tokenizer, policy: Policy, *, version: int = 0):
        self.tokenizer, self.policy = tokenizer, policy
        self._version = version
        self.calls = 0
        self._replies: list[str] | None = None  # set by from_replies: replies by turn instead of the policy
        self._turns: OrderedDict[str, int] = OrderedDict()  # calls so far per trajectory (replies only)

    @classmethod
    def from_replies(cls, tokenizer: Tokenizer, replies: Sequence[str], *, version: int = 0) -> ScriptedEngine:
        """An engine whose n-th call of each trajectory answers `replies[n]` (the last one repeats)."""
        engine = cls(tokenizer, lambda prompt: replies[-1], version=version)
        engine._replies = list(replies)
        return engine

    def _reply(self, request: GenerateRequest, prompt: str) -> str:
        if self._replies is None:
            return self.policy(prompt)
        key = request.trajectory_id or request.request_id
        n = self._turns.pop(key, 0)
        self._turns[key] = n + 1
        if len(self._turns) > 100_000:  # forget the oldest trajectories
            self._turns.popitem(last=False)
        return self._replies[min(n, len(self._replies) - 1)]

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        self.calls += 1
        prompt = self.tokenizer.decode(request.input_ids or [], skip_special_tokens=False)
        text = self._reply(request, prompt)
        sp = request.sampling
        stop_reason: StopReason = "length"
        cut = len(text)
        for s in sp.stop:
            i = text.find(s)
            if i >= 0 and i + len(s) < cut:
                cut, stop_reason = i + len(s), "stop"
            elif i >= 0 and i + len(s) == cut:
                stop_reason = "stop"
        text = text[:cut]
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) > sp.max_new_tokens:
            ids, stop_reason = ids[: sp.max_new_tokens], "length"
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        elif stop_reason == "length" and len(ids) < sp.max_new_tokens:
            stop_reason = "stop"  # the policy ended its turn on its own (as a model emitting eos)
        n = len(ids)
        return GenerateResponse(
            output_ids=ids,
            output_logprobs=[0.0] * n,
            output_versions=[self._version] * n,
            stop_reason=stop_reason,
            text=text,
            input_len=len(request.input_ids or []),
        )

    async def pause(self) -> None:
        return None

    async def resume(self) -> None:
        return None

    async def update_weights(self, source: WeightSource, version: int) -> None:
        self._version = version

    async def close(self) -> None:
        return None


@register_engine(
    "scripted",
    options=ScriptedEngineConfig,
    summary="no model: plays engine.replies in turn (dry runs and tests); model gives the tokenizer",
)
def build_scripted(cfg: EngineConfig, **context: Any) -> ScriptedEngine:
    from asearch.models.loading import load_tokenizer

    return ScriptedEngine.from_replies(cast(Tokenizer, load_tokenizer(cfg.model)), cfg.options.replies)
