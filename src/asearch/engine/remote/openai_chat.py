"""A client for any OpenAI-compatible chat endpoint (vLLM, SGLang, llama.cpp server, Ollama, hosted APIs).

Used by judges and data synthesis: bounded concurrency, retries under `asearch.net`'s one policy (jittered
backoff on 408/425/429/500/502/503/504, connect errors and timeouts, Retry-After honoured), and running
token-usage totals. The API key
comes only from an environment variable and is never logged. `OpenAIChatEngine` adapts it to `Engine`
(engine kind `openai`): it takes chat messages, or the agent's token prompts, which it reads back into
chat messages with the tokenizer's chat template.
"""

from __future__ import annotations

import asyncio
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import BaseModel, Field

from asearch.engine.registry import register_engine
from asearch.engine.remote.http import HttpConfig, JsonHttpClient, RemoteHTTPError
from asearch.engine.types import GenerateRequest, GenerateResponse, StopReason, WeightSource
from asearch.errors import ConfigError, RemoteError
from asearch.net import RetryConfig

if TYPE_CHECKING:
    from asearch.engine.registry import EngineConfig


# OpenAI's API takes at most 4 stop strings (vLLM refuses a 5th with HTTP 400); more are applied client-side.
MAX_STOP_STRINGS = 4


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
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 120.0,
        retry_timeouts: bool = True,
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
                backoff_s=backoff_s,
                max_backoff_s=max_backoff_s,
                max_retry_after_s=max_retry_after_s,
                retry_timeouts=retry_timeouts,
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


class OpenAIEngineConfig(RetryConfig):
    """Options of engine kind `openai`: any OpenAI-compatible chat server. `engine.model` is the name the
    server knows the model by; `engine.base_url` its API root (http://host:port gets /v1 added). The retry
    knobs (retries, backoff_s, max_backoff_s, max_retry_after_s, retry_timeouts) are `asearch.net`'s."""

    tokenizer: str | None = Field(
        None,
        description="HF name, directory or alias of the served model's tokenizer (default: engine.model). "
        "The agent writes its prompts as tokens with this tokenizer's chat template; the engine reads them "
        "back into chat messages. Loaded on first use: judges and solvers that send messages never need it.",
    )
    api_key_env: str = Field(
        "OPENAI_API_KEY", description="Environment variable holding the API key (may be unset); never logged."
    )
    require_api_key: bool = Field(False, description="Fail at start when that variable is unset (hosted APIs).")
    max_concurrency: int = Field(16, ge=1, description="Requests in flight to the server.")
    timeout_s: float = Field(120.0, gt=0, description="Per request.")
    retries: int = Field(
        5, ge=0, description="HTTP retries on 408/425/429/5xx/connection errors (jittered backoff, Retry-After honoured)."
    )
    max_backoff_s: float = Field(30.0, ge=0, description="Cap on one backoff wait.")
    max_retry_after_s: float = Field(120.0, ge=0, description="Cap on a server's Retry-After that is honoured.")
    prefill_fields: dict[str, Any] = Field(
        default_factory=lambda: {"continue_final_message": True, "add_generation_prompt": False},
        description="Sent when the prompt ends inside an assistant turn the agent opened (a style's act prefix "
        "or reading turn): that partial turn goes as the last assistant message and these fields ask the server "
        "to continue it. The default is vLLM's and SGLang's; llama.cpp server and Ollama continue a last "
        "assistant message on their own ({}).",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="More request fields, sent as they are (server-specific, e.g. {repetition_penalty: 1.1}).",
    )


class ChatTemplateReader:
    """Reads a prompt rendered with a tokenizer's chat template back into chat messages.

    The text around each role's content is found by rendering a conversation of marker strings, the
    way the agent loop finds it (`_user_turn_wrappers`), so any template whose wrappers do not depend on
    the content works. A prompt that is not in the template's shape becomes one user message.
    """

    _SYSTEM, _USER, _ASSISTANT, _NEXT = "\x00SYSTEM\x00", "\x00USER\x00", "\x00ASSISTANT\x00", "\x00NEXT\x00"

    def __init__(self, tokenizer: Any):
        def render(*contents: str) -> str:
            roles = ["system", "user", "assistant", "user"]
            messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        try:
            self.head, rest = render(self._SYSTEM, self._USER).split(self._SYSTEM, 1)
            self.system_end, self.first_open = rest.split(self._USER, 1)  # first_open: opens the first reply
            after = render(self._SYSTEM, self._USER, self._ASSISTANT, self._NEXT).split(self._ASSISTANT, 1)[1]
            self.close, self.open = after.split(self._NEXT, 1)  # close: reply -> user; open: user -> reply
        except ValueError as e:  # a template that drops or rewrites some role's content
            name = getattr(tokenizer, "name_or_path", "the tokenizer")
            raise ValueError(f"cannot read chat prompts back with the chat template of {name}: {e}") from e

    def read(self, prompt: str) -> tuple[list[dict[str, str]], str]:
        """(messages, partial): `partial` is the start of the assistant turn the prompt ends in ("" for none)."""
        i = prompt.find(self.system_end, len(self.head)) if prompt.startswith(self.head) else -1
        j = prompt.find(self.first_open, i + len(self.system_end)) if i >= 0 else -1
        if j < 0:
            return [{"role": "user", "content": prompt}], ""
        messages = [
            {"role": "system", "content": prompt[len(self.head) : i]},
            {"role": "user", "content": prompt[i + len(self.system_end) : j]},
        ]
        pos = j + len(self.first_open)
        while (k := prompt.find(self.close, pos)) >= 0:
            messages.append({"role": "assistant", "content": prompt[pos:k]})
            pos = k + len(self.close)
            r = prompt.find(self.open, pos)
            if r < 0:  # ends inside a user turn: the server opens the reply itself
                messages.append({"role": "user", "content": prompt[pos:]})
                return messages, ""
            messages.append({"role": "user", "content": prompt[pos:r]})
            pos = r + len(self.open)
        return messages, prompt[pos:]


class OpenAIChatEngine:
    """`Engine` over a chat endpoint: takes `GenerateRequest.messages`, or `input_ids` (with a tokenizer).

    Chat endpoints return text, not token ids. With a tokenizer the reply is re-tokenized into
    `output_ids`, with log-prob 0.0 and this engine's version for every token, so the agent loop can run on
    it; these are not the model's own tokens or log-probs, so the engine serves asking, evaluation, judging
    and synthesis, never RL rollouts. Without one, `output_ids` stay empty. A token prompt is decoded and read
    back into messages (`ChatTemplateReader`); a prompt that ends inside an assistant turn is continued
    (`prefill_fields`). Chat servers drop the stop string they stopped at; the `Engine` contract keeps it,
    so it is put back when the server names it (vLLM's `stop_reason`) or it closes a tag left open. The
    API takes at most `MAX_STOP_STRINGS`: the first ones are sent, the others cut the reply here.
    Weights are the endpoint's own: `update_weights` raises. Non-OpenAI sampling fields (`top_k`,
    `stop_token_ids`) are sent only when set, since hosted APIs reject unknown fields; a token prompt's
    `stop_token_ids` (ids of our tokenizer) are not sent: the server's template ends its turns itself.
    """

    def __init__(
        self,
        client: OpenAIChatClient,
        *,
        version: int = 0,
        tokenizer: Any = None,
        load_tokenizer: Any = None,
        prefill_fields: dict[str, Any] | None = None,
        extra_body: dict[str, Any] | None = None,
    ):
        self.client = client
        self._version = version
        self._tokenizer = tokenizer
        self._load_tokenizer = load_tokenizer  # () -> tokenizer, called on first use when none was given
        self._reader: ChatTemplateReader | None = None
        self.prefill_fields = dict(prefill_fields or {})
        self.extra_body = dict(extra_body or {})
        self._admit = asyncio.Event()
        self._admit.set()

    @property
    def version(self) -> int:
        return self._version

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None and self._load_tokenizer is not None:
            self._tokenizer = self._load_tokenizer()
        return self._tokenizer

    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        messages, partial = self._messages(request)
        sampling = {**self._sampling(request), **self.extra_body}
        if partial:
            messages = [*messages, {"role": "assistant", "content": partial}]
            sampling.update(self.prefill_fields)
        await self._admit.wait()
        result = await self.client.chat(messages, **sampling)
        text = _restore_stop(result, request.sampling.stop[:MAX_STOP_STRINGS], partial)
        text, cut = _cut_at_stop(text, request.sampling.stop[MAX_STOP_STRINGS:])
        ids = self.tokenizer.encode(text, add_special_tokens=False) if self._has_tokenizer() else []
        stop: StopReason = "length" if result.finish_reason == "length" and not cut else "stop"
        return GenerateResponse(
            output_ids=ids,
            output_logprobs=[0.0] * len(ids),
            output_versions=[self._version] * len(ids),
            stop_reason=stop,
            text=text,
            input_len=result.usage["prompt_tokens"],
            latency_s=result.latency_s,
            usage=dict(result.usage),
        )

    def _has_tokenizer(self) -> bool:
        return self._tokenizer is not None or self._load_tokenizer is not None

    def _messages(self, request: GenerateRequest) -> tuple[list[dict[str, str]], str]:
        """The request's messages, or its token prompt read back into messages (+ the partial reply)."""
        if request.messages:
            return list(request.messages), ""
        if not request.input_ids or not self._has_tokenizer():
            raise ValueError(
                "OpenAIChatEngine needs GenerateRequest.messages, or input_ids and a tokenizer "
                "(engine.tokenizer / OpenAIChatEngine(tokenizer=...))"
            )
        tok = self.tokenizer
        prompt = tok.decode(request.input_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not getattr(tok, "chat_template", None):
            return [{"role": "user", "content": prompt}], ""
        if self._reader is None:
            self._reader = ChatTemplateReader(tok)
        return self._reader.read(prompt)

    def _sampling(self, request: GenerateRequest) -> dict[str, Any]:
        sp = request.sampling
        sampling: dict[str, Any] = {
            "temperature": sp.temperature,
            "top_p": sp.top_p,
            "max_tokens": sp.max_new_tokens,
        }
        if sp.stop:
            sampling["stop"] = list(sp.stop[:MAX_STOP_STRINGS])
        if sp.seed is not None:
            sampling["seed"] = sp.seed
        if sp.top_k > 0:
            sampling["top_k"] = sp.top_k
        if sp.stop_token_ids and request.messages:
            sampling["stop_token_ids"] = list(sp.stop_token_ids)
        if request.trajectory_id:
            sampling["user"] = request.trajectory_id
        return sampling

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


def _cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """(`text` up to and with the first of `stops` in it, whether one was): the stop strings past the API's
    limit, which the server was not sent, are applied here."""
    ends = [i + len(s) for s in stops if (i := text.find(s)) >= 0]
    return (text[: min(ends)], True) if ends else (text, False)


def _restore_stop(result: ChatResult, stops: list[str], partial: str) -> str:
    """The reply with the stop string the server stopped at and cut off, when it can be told which:
    the server names it (vLLM's `stop_reason`), or it closes a `<tag>` left open in the turn."""
    text = result.text
    if result.finish_reason != "stop" or not stops or any(text.endswith(s) for s in stops):
        return text
    choices = result.raw.get("choices") or [{}]
    named = choices[0].get("stop_reason") if isinstance(choices[0], dict) else None
    if named is not None:  # a string it matched, or the id of a stop token (then nothing was cut)
        return text + named if isinstance(named, str) and named in stops else text
    turn = partial + text
    for s in stops:
        if s.startswith("</") and s.endswith(">") and turn.rfind("<" + s[2:]) > turn.rfind(s):
            return text + s
    return text


def retry_kwargs(cfg: RetryConfig) -> dict[str, Any]:
    """The retry knobs of a config, as `OpenAIChatClient` takes them."""
    return {k: getattr(cfg, k) for k in RetryConfig.model_fields}


def chat_client(cfg: EngineConfig) -> OpenAIChatClient:
    """An `OpenAIChatClient` for an engine config of kind openai (judges, synthesis endpoints)."""
    o: OpenAIEngineConfig = cfg.options
    if cfg.kind != "openai" or cfg.base_url is None:
        raise ConfigError(f"a chat client needs engine.kind=openai and engine.base_url (got kind {cfg.kind!r})")
    return OpenAIChatClient(
        api_root(cfg.base_url),
        cfg.model,
        api_key_env=o.api_key_env,
        require_api_key=o.require_api_key,
        max_concurrency=o.max_concurrency,
        timeout=o.timeout_s,
        **retry_kwargs(o),
    )


def flat_endpoint_keys(data: Any, where: str, defaults: dict[str, Any], *, keep: frozenset[str] = frozenset()) -> Any:
    """An endpoint config (judge, synthesis) as `engine`, engine kind openai: `engine.kind` defaults to openai,
    and the older flat keys (url or base_url, model, api_key_env, max_concurrency, timeout_s, retries or
    transport_retries; those in `keep` excepted) load as `engine.*` with a FutureWarning, `defaults` (the old
    defaults where they differ from kind openai's) under them."""
    flat = {"base_url": "base_url", "url": "base_url", "model": "model", "api_key_env": "api_key_env",
            "max_concurrency": "max_concurrency", "timeout_s": "timeout_s", "retries": "retries",
            "transport_retries": "retries"}  # fmt: skip
    if not isinstance(data, dict):
        return data
    given = {k: data[k] for k in flat if k in data and k not in keep}
    if not given and not isinstance(data.get("engine"), dict):
        return data  # the new shape, validated already (an assignment) or to validate as it is
    data = {k: v for k, v in data.items() if k not in given}
    engine = data.get("engine")
    engine = engine.model_dump(exclude_unset=True) if isinstance(engine, BaseModel) else engine
    if given:
        moved = ", ".join(sorted({f"{where}.engine.{flat[k]}" for k in given}))
        warnings.warn(
            f"{', '.join(f'{where}.{k}' for k in sorted(given))}: deprecated, use {moved} (engine kind openai)",
            FutureWarning,
            stacklevel=2,
        )
        # the flat keys win over an `engine` beside them (an override on top of a file in the new shape)
        engine = {**(defaults if engine is None else {}), **(engine or {}), **{flat[k]: v for k, v in given.items()}}
    if isinstance(engine, dict):
        data["engine"] = {"kind": "openai", **engine}
    return data


def api_root(base_url: str) -> str:
    """`http://host:port` -> `http://host:port/v1` (what vLLM, SGLang, llama.cpp server and Ollama serve);
    a URL with a path is the API root already."""
    url = base_url.rstrip("/")
    return url if urlsplit(url).path else url + "/v1"


@register_engine(
    "openai",
    options=OpenAIEngineConfig,
    needs_url=True,
    summary="any OpenAI-compatible chat server (vLLM, SGLang, llama.cpp, Ollama, hosted APIs); "
    "text only: asking, evaluation, synthesis, not RL",
)
def build_openai(cfg: EngineConfig, **context: Any) -> OpenAIChatEngine:
    o: OpenAIEngineConfig = cfg.options
    client = chat_client(cfg)
    name = o.tokenizer or cfg.model

    def tokenizer() -> Any:
        from asearch.models.loading import load_tokenizer

        try:
            return load_tokenizer(name)
        except ConfigError as e:
            raise ConfigError(
                f"engine kind openai needs the served model's tokenizer for token prompts; set engine.tokenizer "
                f"to its HF name or directory ({e})"
            ) from None

    return OpenAIChatEngine(
        client, load_tokenizer=tokenizer, prefill_fields=o.prefill_fields, extra_body=o.extra_body
    )
