"""A client for any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp server, hosted APIs).

Used by judges and data synthesis: bounded concurrency, retries with jittered exponential backoff on
429/5xx/connect errors/timeouts (honouring Retry-After), and running token-usage totals. The API key
comes only from an environment variable and is never logged. `OpenAIChatEngine` adapts it to `Engine`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from asearch.engine.http import HttpConfig, JsonHttpClient, RemoteHTTPError
from asearch.engine.types import GenerateRequest, GenerateResponse, StopReason, WeightSource
from asearch.errors import RemoteError


@dataclass(slots=True)
class ChatResult:
    text: str
    usage: dict[str, int]  # prompt_tokens / completion_tokens as the server reported them (0 if it did not)
    latency_s: float
    finish_reason: str  # as the server said: stop, length, content_filter, tool_calls, ...
    raw: dict[str, Any] = field(default_factory=dict, repr=False)  # the whole response body


@dataclass(slots=True)
class ChatUsage:
    """Running totals since the client was made."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0  # chat() calls answered
    retries: int = 0  # extra HTTP attempts after retryable failures
    failures: int = 0  # chat() calls that failed for good

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


class OpenAIChatClient:
    """`await client.chat(messages, temperature=0.2, max_tokens=256)` against `{base_url}/chat/completions`.

    `base_url` is the API root including its version prefix, e.g. `http://127.0.0.1:8000/v1` or
    `https://api.openai.com/v1`. Extra keyword arguments to `chat` are sent as request fields as they are.
    The key is read from the environment variable `api_key_env` (none needed for local servers unless
    `require_api_key`).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        require_api_key: bool = False,
        max_concurrency: int = 16,
        timeout: float = 120.0,
        retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        retry_after_max_s: float = 120.0,
    ):
        self.model = model
        self.api_key_env = api_key_env
        key = os.environ.get(api_key_env, "")
        if require_api_key and not key:
            raise RemoteError(f"{base_url}: set the API key in the environment variable {api_key_env}")
        self.usage = ChatUsage()
        self._http = JsonHttpClient(
            base_url,
            cfg=HttpConfig(
                timeout_s=timeout,
                retries=retries,
                backoff_base_s=backoff_base_s,
                backoff_max_s=backoff_max_s,
                retry_after_max_s=retry_after_max_s,
                max_concurrency=max_concurrency,
            ),
            headers={"Authorization": f"Bearer {key}"} if key else None,
            what=f"chat endpoint {base_url}",
        )
        self._sem = asyncio.Semaphore(max_concurrency)

    def __repr__(self) -> str:  # the key lives only in the HTTP client's headers, never here
        return f"OpenAIChatClient({self._http.base_url!r}, {self.model!r}, key from ${self.api_key_env})"

    @property
    def base_url(self) -> str:
        return self._http.base_url

    async def chat(self, messages: Sequence[dict[str, Any]], **sampling: Any) -> ChatResult:
        body = {"model": self.model, "messages": list(messages), **sampling}
        start = time.monotonic()
        retries_before = self._http.stats.retries
        try:
            async with self._sem:
                data = await self._http.post_json("/chat/completions", body)
        except RemoteHTTPError as e:
            self.usage.failures += 1
            if e.status_code in (401, 403):
                raise RemoteError(
                    f"{e}\nCheck the API key in the environment variable {self.api_key_env}."
                ) from e
            raise
        except RemoteError:
            self.usage.failures += 1
            raise
        finally:
            self.usage.retries += self._http.stats.retries - retries_before
        try:
            choice = data["choices"][0]
            text = (choice.get("message") or {}).get("content") or ""
            finish = choice.get("finish_reason") or "stop"
            u = data.get("usage") or {}
            usage = {
                "prompt_tokens": int(u.get("prompt_tokens") or 0),
                "completion_tokens": int(u.get("completion_tokens") or 0),
            }
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            self.usage.failures += 1
            raise RemoteError(
                f"{self.base_url}: unexpected chat completion body ({e!r}): {str(data)[:300]}"
            ) from e
        self.usage.requests += 1
        self.usage.prompt_tokens += usage["prompt_tokens"]
        self.usage.completion_tokens += usage["completion_tokens"]
        return ChatResult(text, usage, time.monotonic() - start, finish, data)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> OpenAIChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class OpenAIChatEngine:
    """`Engine` over a chat endpoint: takes `GenerateRequest.messages`, returns text.

    Chat endpoints return text, not token ids: `output_ids`, `output_logprobs` and `output_versions`
    are empty, so this engine serves evaluation, judging and synthesis, never RL rollouts. Weights are
    the endpoint's own: `update_weights` raises. Non-OpenAI sampling fields (`top_k`, `stop_token_ids`)
    are sent only when set, since hosted APIs reject unknown fields.
    """

    def __init__(self, client: OpenAIChatClient, *, version: int = 0):
        self.client = client
        self._version = version
        self._admit = asyncio.Event()
        self._admit.set()

    @property
    def version(self) -> int:
        return self._version

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        if not request.messages:
            raise ValueError(
                "OpenAIChatEngine needs GenerateRequest.messages; for token ids use VLLMEngine/SGLangEngine"
            )
        sp = request.sampling
        sampling: dict[str, Any] = {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_new_tokens,
        }
        if sp.stop:
            sampling["stop"] = list(sp.stop)
        if sp.seed is not None:
            sampling["seed"] = sp.seed
        if sp.top_k > 0:
            sampling["top_k"] = sp.top_k
        if sp.stop_token_ids:
            sampling["stop_token_ids"] = list(sp.stop_token_ids)
        if request.trajectory_id:
            sampling["user"] = request.trajectory_id
        await self._admit.wait()
        result = await self.client.chat(request.messages, **sampling)
        stop: StopReason = "length" if result.finish_reason == "length" else "stop"
        return GenerateResponse(
            output_ids=[],
            output_logprobs=[],
            output_versions=[],
            stop_reason=stop,
            text=result.text,
            input_len=result.usage["prompt_tokens"],
            latency_s=result.latency_s,
            usage=dict(result.usage),
        )

    async def pause(self) -> None:
        """Hold new requests on this client (a remote chat endpoint cannot be paused)."""
        self._admit.clear()

    async def resume(self) -> None:
        self._admit.set()

    async def update_weights(self, source: WeightSource, version: int) -> None:
        raise RemoteError(
            "a chat endpoint serves its own fixed weights; use VLLMEngine or SGLangEngine for weight updates"
        )

    async def close(self) -> None:
        self._admit.set()
        await self.client.aclose()
