"""The request bodies of OpenAI's API as pydantic models, and the error they answer with.

    ChatCompletionRequest   /v1/chat/completions: messages (system, developer, user, assistant, tool),
                            tools and tool_choice, logprobs (a flag), vLLM's chat extensions
    CompletionRequest       /v1/completions: prompt (text, token ids, or a batch of either), logprobs (a count)
    both: SamplingFields    the sampling settings, `n`, streaming, and the settings this server refuses

`parse_request(body, chat=...)` validates a decoded JSON body. Values are checked strictly (no "3" for 3, no
true for 1): a client that sends the wrong type has a bug worth hearing about. A bad field answers HTTP 400 in
OpenAI's error shape, naming it in `param` (`messages[0].content`, `temperature`, ...). Fields this server
does not know are ignored, as OpenAI's own server does with new optional fields; fields it knows but cannot
honour (penalties, logit_bias, response_format json, ...) are refused, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_CHOICES = 128  # OpenAI's own cap on n


class APIError(Exception):
    """A request error answered in OpenAI's shape; `param` names the request field at fault."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status_code: int = 400,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.param = param
        self.status_code = status_code
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)


class _Open(BaseModel):
    """A part of a request kept as the client sent it (tools reach the chat template whole)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


# --------------------------------------------------------------------------- messages and tools


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallItem(_Open):
    """A call an assistant message made: {id, type: function, function: {name, arguments}}."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    """One message. `content` is text, a list of text parts, or null (an assistant turn that only called
    tools); an assistant's `tool_calls` and a tool turn's `tool_call_id` reach the chat template."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, v: Any) -> Any:
        if isinstance(v, list):
            for j, part in enumerate(v):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ValueError(f"only text parts are supported, got {part!r} (part {j})")
        return v

    @property
    def text(self) -> str:
        """The content as one string: text parts joined by newlines, '' for none."""
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content)
        return self.content or ""

    def template_form(self) -> dict[str, Any]:
        """The message as HF chat templates take it (arguments as dicts: see `chat_tools.template_message`)."""
        return self.model_dump(exclude_unset=True, exclude={"content"})


class FunctionSpec(_Open):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_Open):
    """A tool offered to the model: {type: function, function: {name, description, parameters}}."""

    type: Literal["function"]
    function: FunctionSpec


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: dict[str, Any]


class StreamOptions(_Body):
    include_usage: bool = False


# --------------------------------------------------------------------------- requests


# Settings this server cannot honour: (field, whether a value is accepted, what to send instead). A request
# with any other value answers 400 rather than silently sampling differently from what it asked for.
UNSUPPORTED: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("presence_penalty", lambda v: v in (None, 0), "penalties are not supported: send 0"),
    ("frequency_penalty", lambda v: v in (None, 0), "penalties are not supported: send 0"),
    ("repetition_penalty", lambda v: v in (None, 1), "penalties are not supported: send 1"),
    ("min_p", lambda v: v in (None, 0), "min_p is not supported: send 0"),
    ("logit_bias", lambda v: not v, "logit_bias is not supported"),
    ("functions", lambda v: not v, "function calling is not supported"),
    ("response_format", lambda v: v is None or v == {"type": "text"}, "only response_format type text is supported"),
    ("top_logprobs", lambda v: not v, "top_logprobs is not supported: only the sampled token's log-prob"),
    ("echo", lambda v: not v, "echo is not supported"),
    ("suffix", lambda v: not v, "suffix is not supported"),
)


class SamplingFields(_Body):
    """What both endpoints share: the model, sampling, choices and streaming."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)  # vLLM's extension; -1 or 0: off
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)
    best_of: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True
    # refused unless off (UNSUPPORTED): typed loosely so the refusal, not a type error, names them
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    min_p: Any = None
    logit_bias: Any = None
    functions: Any = None
    response_format: Any = None
    top_logprobs: Any = None
    echo: Any = None
    suffix: Any = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_unset(cls, data: Any) -> Any:
        """A field sent as null reads as not sent (some clients write every field)."""
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_strings(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, str) and not (isinstance(v, list) and all(isinstance(s, str) for s in v)):
            raise ValueError(f"stop must be a string or a list of strings, got {v!r}")
        return v

    @field_validator("stop_token_ids", mode="before")
    @classmethod
    def _no_ids(cls, v: Any) -> Any:
        return [] if v is None else v

    @model_validator(mode="after")
    def _refusals(self) -> SamplingFields:
        for name, accepted, hint in UNSUPPORTED:
            value = getattr(self, name)
            if not accepted(value):
                raise _Refused(f"{name}={value!r}: {hint}", name)
        if self.best_of not in (None, self.n):
            raise _Refused(f"best_of={self.best_of!r} is not supported: leave it out (or send best_of = n)", "best_of")
        return self

    @property
    def stops(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stop if s]

    @property
    def max_new_tokens(self) -> int | None:
        """`max_completion_tokens`, or the older `max_tokens` (None: up to the context)."""
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(SamplingFields):
    """A `/v1/chat/completions` body."""

    messages: list[ChatMessage]
    logprobs: bool = False
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    add_generation_prompt: bool = True  # vLLM's: open a new assistant reply after the messages
    continue_final_message: bool = False  # vLLM's: continue the last (assistant) message instead

    @field_validator("messages", mode="before")
    @classmethod
    def _some_messages(cls, v: Any) -> Any:
        if not isinstance(v, list) or not v:
            raise ValueError("messages must be a non-empty list of {role, content} objects")
        return v

    @model_validator(mode="after")
    def _continuation(self) -> ChatCompletionRequest:
        if self.continue_final_message and (self.add_generation_prompt or self.messages[-1].role != "assistant"):
            raise _Refused(
                "continue_final_message needs add_generation_prompt=false and a last message with role assistant",
                "continue_final_message",
            )
        if isinstance(self.tool_choice, NamedToolChoice):
            raise _Refused(
                f"tool_choice={self.tool_choice.model_dump()!r}: a named function is not supported (it needs "
                "constrained decoding); send auto, required or none",
                "tool_choice",
            )
        if not self.tools and self.tool_choice == "required":
            raise _Refused(f"tool_choice={self.tool_choice!r} needs tools", "tool_choice")
        return self


class CompletionRequest(SamplingFields):
    """A `/v1/completions` body; `logprobs` is a count of alternatives per token (only 0 is served)."""

    prompt: str | list[int] | list[str | list[int]]
    logprobs: int | None = Field(None, ge=0)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_shape(cls, v: Any) -> Any:
        def ids(p: Any) -> bool:
            return isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)

        if isinstance(v, str) or (ids(v) and v):
            return v
        if not isinstance(v, list) or not v or not all(isinstance(p, str) or ids(p) for p in v):
            raise ValueError("prompt must be a string, a list of token ids, or a non-empty list of either")
        return v

    @model_validator(mode="after")
    def _sampled_logprob_only(self) -> CompletionRequest:
        if self.logprobs:
            raise _Refused(
                f"logprobs={self.logprobs}: only the sampled token's log-prob is available, send logprobs=0",
                "logprobs",
            )
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompts of the batch (one for a single string or list of ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):  # one prompt of token ids (the validator refused an empty one)
            return [p]
        return list(p)


class _Refused(ValueError):
    """A field's value this server does not serve; `param` names it (kept through pydantic's wrapping)."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def parse_request(body: dict[str, Any], *, chat: bool) -> ChatCompletionRequest | CompletionRequest:
    """The validated request of a decoded body; an APIError (400) naming the first bad field otherwise."""
    model = ChatCompletionRequest if chat else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise _api_error(model, e) from None


def _api_error(model: type[BaseModel], err: ValidationError) -> APIError:
    e = err.errors()[0]
    loc = [p for p in e["loc"] if not _union_tag(p)]
    param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
    cause = (e.get("ctx") or {}).get("error")
    if isinstance(cause, _Refused):
        return APIError(str(cause), param=cause.param)
    if isinstance(cause, ValueError):
        message = str(cause)
        return APIError(message if not param or message.startswith(str(loc[0])) else f"{param}: {message}", param=param)
    return APIError(f"{param or 'the request'} {_expected(model, loc, e)}, got {e.get('input')!r}", param=param)


def _union_tag(part: Any) -> bool:
    """Whether a location part names a union member (`stop.str`, `content.list[TextPart]`), not a field."""
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or "-" in part)


def _expected(model: type[BaseModel], loc: list[Any], e: Any) -> str:
    """'must be ...' for one pydantic error: the bound of a number, the type, the allowed values."""
    ctx, kind = e.get("ctx") or {}, e["type"]
    field = model.model_fields.get(str(loc[0])) if len(loc) == 1 else None
    noun = "an integer" if field is not None and "int" in str(field.annotation) else "a number"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"must be {noun} {bounds[kind]} {limit:g}" if isinstance(limit, float) else f"must be {noun} {bounds[kind]} {limit}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return "must be an integer"
    if kind in ("float_type", "float_parsing"):
        return "must be a number"
    if kind == "bool_type":
        return "must be true or false"
    if kind == "literal_error":
        return f"must be {ctx.get('expected', 'one of the allowed values')}"
    if kind == "missing":
        return "is required"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "must be an object"
    if kind == "list_type":
        return "must be a list"
    if kind == "string_type":
        return "must be a string"
    return e["msg"].lower()
