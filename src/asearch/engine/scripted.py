"""An engine whose "model" is a Python policy over the decoded prompt: for tests, benchmarks and experts.

The policy sees the prompt text and returns the continuation text; the engine tokenizes it, applies
stop strings and the token budget like a real engine, and reports log-prob 0 (a deterministic policy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asearch.engine.types import GenerateRequest, GenerateResponse, WeightSource

Policy = Callable[[str], str]


class ScriptedEngine:
    def __init__(self, tokenizer: Any, policy: Policy, *, version: int = 0):
        self.tokenizer, self.policy = tokenizer, policy
        self._version = version
        self.calls = 0

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        self.calls += 1
        prompt = self.tokenizer.decode(request.input_ids or [], skip_special_tokens=False)
        text = self.policy(prompt)
        sp = request.sampling
        stop_reason = "length"
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
