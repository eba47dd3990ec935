"""OpenAI's API on the engine server: `/v1/chat/completions`, `/v1/completions` and `/v1/models`.

`mount_openai_api(app, server)` adds these routes to the app of `asearch.engine.server.app`, so any model
`asearch engine serve` loads answers the official `openai` client, the project's `OpenAIChatClient` (judges,
synthesis, `ask --engine openai`) and curl. Every choice is one `EngineServer.run`: it joins the engine's
continuous batch beside `/generate` requests, waits at the same pause / weight-update gate and reuses the
same prefix cache. Nothing here serialises requests.

    chat messages ── tokenizer's chat template ──┐
    completion prompt (text or token ids) ────────┴─> prompt ids ─> EngineServer.run, once per choice
        (resent with its tokens so far after a pause or update aborts it) ─> TextTracker ─> choice text

A choice's text is its tokens decoded without special tokens (vLLM's default). The token that ended it
(EOS, `stop_token_ids`) is not in it, and it ends before the first stop string: OpenAI drops the stop
string, and names it in the choice's `stop_reason` (vLLM's field). A stream sends the same text in pieces,
holding back any tail that could still grow into a stop string, so the pieces add up to the text a
non-streamed request returns. Log-probs are the sampled tokens' under the distribution they were drawn from
(after temperature, top-k and top-p), as `/generate` reports them; there are no top alternatives.

Request bodies are validated by the pydantic models of `openai_requests` (ChatCompletionRequest,
CompletionRequest). Errors have OpenAI's shape, {"error": {"message", "type", "param", "code"}}: 400 for a
bad request, `param` naming the field (a setting this server cannot honour is refused, never ignored), 404
`model_not_found` for a `model` other than the served name (a request without `model` gets the served one).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from asearch.engine.chat_tools import (
    FormatName,
    ParsedReply,
    ToolRequest,
    ToolRequestError,
    parse_reply,
    streamable,
    template_message,
    tool_call_format,
)
from asearch.engine.server.openai_requests import (
    MAX_CHOICES,
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    parse_request,
)
from asearch.engine.types import GenerateResponse, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

__all__ = ["APIError", "TextTracker", "complete", "json_body", "mount_openai_api"]


class TokenServer(Protocol):
    """What the routes need of `asearch.engine.server.app.EngineServer` (a protocol: that module imports this one)."""

    engine: Any  # an engine with a `tokenizer`; `max_seq_len` and `config.vocab_size` are used when present
    model_path: str
    served_model_name: str
    eos_token_ids: list[int]
    started: float

    async def run(
        self,
        ids: list[int],
        sampling: SamplingParams,
        *,
        rid: str = "",
        on_token: Callable[[int, float], None] | None = None,
    ) -> tuple[GenerateResponse, str]: ...


async def json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object ({} for an empty body); anything else is a 400."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:
        raise APIError(f"the request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise APIError("the request body must be a JSON object")
    return data


# --------------------------------------------------------------------------- requests (openai_requests)


def sampling_params(req: SamplingFields, *, eos_token_ids: Sequence[int], max_new_default: int) -> SamplingParams:
    """The engine's sampling settings for a validated request.

    `max_completion_tokens` (or the older `max_tokens`) defaults to `max_new_default`; `seed` seeds the
    choice's random stream. vLLM's extensions `top_k` (-1 or 0: off), `stop_token_ids` and `ignore_eos` are
    read too. The tokenizer's EOS ends a choice unless `ignore_eos`.
    """
    stop_ids = list(req.stop_token_ids)
    if not req.ignore_eos:
        stop_ids += [t for t in eos_token_ids if t not in stop_ids]
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=max(0, req.top_k),
        max_new_tokens=req.max_new_tokens or max_new_default,
        stop=req.stops,
        stop_token_ids=stop_ids,
        seed=req.seed,
    )


@dataclass(slots=True)
class Options:
    """How a request wants its answer (beside sampling)."""

    n: int = 1
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk carries the usage
    logprobs: bool = False
    skip_special_tokens: bool = True  # vLLM's extension; special tokens are left out of the text


def request_options(req: ChatCompletionRequest | CompletionRequest) -> Options:
    # chat: logprobs is a flag; completions: a count of alternatives, of which only 0 is served
    logprobs = req.logprobs if isinstance(req, ChatCompletionRequest) else req.logprobs == 0
    return Options(
        n=req.n,
        stream=req.stream,
        include_usage=req.include_usage,
        logprobs=bool(logprobs),
        skip_special_tokens=req.skip_special_tokens,
    )


def check_model(model: str | None, served: str) -> None:
    if model is not None and model != served:
        raise APIError(
            f"The model {model!r} does not exist: this server serves {served!r} (GET /v1/models)",
            param="model",
            status_code=404,
            code="model_not_found",
        )


# --------------------------------------------------------------------------- prompts


@dataclass(frozen=True, slots=True)
class ChatTools:
    """A chat request's tools and the format its replies are parsed in (the chat template's)."""

    request: ToolRequest
    format: FormatName


def chat_tools(tokenizer: PreTrainedTokenizerBase, req: ChatCompletionRequest, served: str) -> ChatTools | None:
    """The request's tools (None without any); refused when the model's chat template renders none."""
    if not req.tools:
        return None
    fmt = tool_call_format(tokenizer)
    if fmt is None:
        raise APIError(
            f"the chat template of {served!r} does not render tools, so the model cannot be offered any: "
            "describe them in the messages instead",
            param="tools",
        )
    choice = req.tool_choice if isinstance(req.tool_choice, str) else "auto"  # a named one is refused already
    return ChatTools(ToolRequest(tuple(t.model_dump(exclude_unset=True) for t in req.tools), choice), fmt)


def chat_prompt(
    tokenizer: PreTrainedTokenizerBase, req: ChatCompletionRequest, served: str, tools: ChatTools | None = None
) -> list[int]:
    """The prompt ids of a chat request: its messages (and `tools`) rendered with the tokenizer's chat template.

    vLLM's `add_generation_prompt` (default true) and `continue_final_message` (default false: continue the
    last, assistant message instead of opening a new reply) are honoured; `OpenAIChatEngine` sends them.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(
            f"the model {served!r} has no chat template, so it cannot answer chat requests: "
            "send a prompt to /v1/completions instead",
            param="messages",
        )
    conversation = []
    for i, m in enumerate(req.messages):
        try:  # {role, content}, an assistant's tool_calls with dict arguments, a tool turn's tool_call_id
            conversation.append(template_message(m.template_form(), m.text))
        except ToolRequestError as e:
            raise APIError(f"messages[{i}]: {e}", param=f"messages[{i}]") from None
    try:
        text = tokenizer.apply_chat_template(
            conversation,
            tokenize=False,
            add_generation_prompt=req.add_generation_prompt,
            continue_final_message=req.continue_final_message,
            tools=list(tools.request.tools) if tools is not None else None,
        )
    except Exception as e:  # noqa: BLE001 - jinja's TemplateError (roles that must alternate, ...) and kin
        raise APIError(f"the chat template cannot render these messages: {e}", param="messages") from None
    return list(tokenizer.encode(text, add_special_tokens=False))


def completion_prompts(tokenizer: PreTrainedTokenizerBase, req: CompletionRequest) -> list[list[int]]:
    """The prompt ids of a completions request: `prompt` is a string, a list of token ids, or a list of
    either (a batch; its choices are numbered prompt by prompt, n each)."""
    return [
        list(tokenizer.encode(p, add_special_tokens=True)) if isinstance(p, str) else list(p) for p in req.prompts
    ]


def check_prompt(ids: list[int], engine: Any, param: str) -> None:
    """Refuse what the engine could not generate after: no tokens, unknown ids, no room left in the context."""
    if not ids:
        raise APIError("the prompt has no tokens", param=param)
    vocab = getattr(getattr(engine, "config", None), "vocab_size", None)
    if vocab is not None and (min(ids) < 0 or max(ids) >= vocab):
        raise APIError(f"token id out of range [0, {vocab}): {min(ids)}..{max(ids)}", param=param)
    context = getattr(engine, "max_seq_len", None)
    if context is not None and len(ids) >= context:
        raise APIError(
            f"this model's context is {context} tokens (--max-seq-len) and the prompt has {len(ids)}, "
            "which leaves no room to generate",
            param=param,
            code="context_length_exceeded",
        )


# --------------------------------------------------------------------------- text


class TextTracker:
    """One choice's text as its tokens arrive.

    Tokens are decoded incrementally (each new piece decoded with the token before it, so tokenizers that
    drop a leading space at the start still give it; a character split across tokens waits for its last
    byte). The text is cut before the first stop string, and `take` releases only what can no longer
    change: never a tail that could still grow into a stop string, until the choice is done.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, stops: Sequence[str], *, skip_special_tokens: bool = True
    ):
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self.stops = [s for s in stops if s]
        self.text = ""  # everything decoded so far, stop string and what follows it included
        self.cut: int | None = None  # where the first stop string starts, once one has appeared
        self.matched: str | None = None  # that stop string
        self.done = False
        self._ids: list[int] = []
        self._prefix = 0  # ids[_prefix:_read] decode to the end of `text`: the context of the next piece
        self._read = 0
        self._taken = 0  # text[:_taken] has been released

    @property
    def content(self) -> str:
        """The choice's text: up to the first stop string."""
        return self.text if self.cut is None else self.text[: self.cut]

    def push(self, token_id: int) -> None:
        self._ids.append(token_id)
        if self.cut is None:
            self._decode_new(final=False)

    def finish(self) -> None:
        if self.cut is None:
            self._decode_new(final=True)
        self.done = True

    def take(self) -> str:
        """The text not yet taken that can no longer change (all of it once done or stopped)."""
        final = self.done or self.cut is not None
        end = len(self.content) if final else len(self.text) - self._holdback()
        piece = self.text[self._taken : end] if end > self._taken else ""
        self._taken = max(self._taken, end)
        return piece

    def _decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=self._skip, clean_up_tokenization_spaces=False))

    def _decode_new(self, *, final: bool) -> None:
        before = self._decode(self._ids[self._prefix : self._read])
        now = self._decode(self._ids[self._prefix :])
        if len(now) <= len(before) or (now.endswith("\ufffd") and not final):
            return  # no new text yet (a skipped special token, half a character)
        start = len(self.text)
        self.text += now[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        longest = max((len(s) for s in self.stops), default=0)
        lo = max(0, start - longest + 1)  # a stop string ending in the old text would have been found already
        hits = [(i, s) for s in self.stops if (i := self.text.find(s, lo)) >= 0]
        if hits:
            self.cut, self.matched = min(hits)

    def _holdback(self) -> int:
        """Length of the longest tail of `text` that is the start of some stop string."""
        best = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best


# --------------------------------------------------------------------------- choices


@dataclass(eq=False)
class Choice:
    """One choice of a completion: its prompt, the tokens generated for it and its text."""

    index: int
    prompt: list[int]
    tracker: TextTracker
    ends: frozenset[int]  # stop token ids: the token that ends the choice is not part of its text
    ids: list[int] = field(default_factory=list)
    visible: list[tuple[int, float]] = field(default_factory=list)  # (id, log-prob) of the text's tokens
    finish_reason: Literal["stop", "length", "tool_calls"] | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (vLLM's field)
    reported: int = 0  # visible tokens whose log-probs have been written
    text_offset: int = 0  # completions log-probs: where the next written token starts in the text
    on_change: Callable[[Choice], None] | None = None  # streaming: called after every token and at the end
    tools: ChatTools | None = None  # the request's tools: the reply is parsed for calls (unless tool_choice none)
    reply: ParsedReply | None = None  # the parsed reply, once done (tools only)
    seen: str = ""  # streaming with tools: the text taken from the tracker so far
    released: int = 0  # streaming with tools: seen[:released] went out as content

    def add(self, token_id: int, logprob: float) -> None:
        self.ids.append(token_id)
        if token_id not in self.ends:
            self.visible.append((token_id, logprob))
            self.tracker.push(token_id)
        if self.on_change is not None:
            self.on_change(self)

    async def run(self, server: TokenServer, sampling: SamplingParams) -> None:
        """Generate until the choice ends. A pause or weight update that aborts it inside the engine is
        invisible to an OpenAI client: the prompt and the tokens so far are sent again (they wait at the
        server's gate), with the budget that is left."""
        while True:
            left = dataclasses.replace(sampling, max_new_tokens=sampling.max_new_tokens - len(self.ids))
            before = len(self.ids)
            on_token = self.add if self.on_change is not None else None
            resp, _ = await server.run([*self.prompt, *self.ids], left, on_token=on_token)
            streamed = len(self.ids) - before
            for tok, lp in zip(resp.output_ids[streamed:], resp.output_logprobs[streamed:], strict=True):
                self.add(tok, lp)
            if resp.stop_reason != "abort" or self.tracker.cut is not None:
                break
        self.tracker.finish()
        if self.tracker.matched is not None:
            self.finish_reason, self.stop_reason = "stop", self.tracker.matched
        elif resp.stop_reason == "stop":
            self.finish_reason = "stop"
            self.stop_reason = self.ids[-1] if self.ids and self.ids[-1] in self.ends else None
        else:
            self.finish_reason = "length"
        if self.tools is not None and self.tools.request.parse:
            self._parse_calls(server)
        if self.on_change is not None:
            self.on_change(self)

    def _parse_calls(self, server: TokenServer) -> None:
        """Read the finished text as content + tool calls; a call that does not parse leaves it text, counted
        in the server's `counts` (`tool_call_parse_errors`)."""
        assert self.tools is not None
        self.reply = parse_reply(self.tracker.content, self.tools.format, self.tools.request.names)
        counts = getattr(server, "counts", None)
        if isinstance(counts, dict):
            key = "tool_call_parse_errors" if self.reply.malformed else "tool_calls"
            counts[key] = counts.get(key, 0) + (1 if self.reply.malformed else len(self.reply.calls))
        on_reply = getattr(server, "on_reply", None)  # a training session records what the reply was
        if callable(on_reply):
            on_reply(self.reply)
        if self.reply.malformed:
            log.info("a malformed tool call is answered as text: %s", self.reply.malformed)
        if self.reply.calls and self.finish_reason == "stop":
            self.finish_reason = "tool_calls"


async def run_choices(
    server: TokenServer, choices: Sequence[Choice], sampling: Sequence[SamplingParams]
) -> None:
    """Run every choice concurrently (each one joins the engine's batch); the first failure cancels the rest."""
    tasks = [asyncio.create_task(c.run(server, sp)) for c, sp in zip(choices, sampling, strict=True)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()


# --------------------------------------------------------------------------- answers


@dataclass(eq=False)
class Completion:
    """One request's choices and how to write them as a response, stream chunks and usage."""

    chat: bool
    model: str
    options: Options
    tokenizer: Any
    choices: list[Choice]
    prompt_tokens: int
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"

    @property
    def object(self) -> str:
        return "chat.completion" if self.chat else "text_completion"

    def usage(self) -> dict[str, int]:
        completion = sum(len(c.ids) for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def logprobs(self, choice: Choice, tokens: Sequence[tuple[int, float]]) -> dict[str, Any] | None:
        if not self.options.logprobs:
            return None
        names = [self.tokenizer.decode([t], skip_special_tokens=False) for t, _ in tokens]
        if self.chat:
            return {
                "content": [
                    {"token": s, "logprob": lp, "bytes": list(s.encode()), "top_logprobs": []}
                    for s, (_, lp) in zip(names, tokens, strict=True)
                ]
            }
        offsets = []
        for s in names:
            offsets.append(choice.text_offset)
            choice.text_offset += len(s)
        return {
            "tokens": names,
            "token_logprobs": [lp for _, lp in tokens],
            "top_logprobs": None,
            "text_offset": offsets,
        }

    def response(self) -> dict[str, Any]:
        choices = []
        for c in self.choices:
            text = c.tracker.content
            body: dict[str, Any] = {"index": c.index}
            body.update({"message": self.message(c)} if self.chat else {"text": text})
            body.update(
                logprobs=self.logprobs(c, c.visible), finish_reason=c.finish_reason, stop_reason=c.stop_reason
            )
            choices.append(body)
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(),
        }

    @staticmethod
    def message(c: Choice) -> dict[str, Any]:
        """A finished chat choice's assistant message: its text, or its parsed content and tool calls."""
        if c.reply is None:
            return {"role": "assistant", "content": c.tracker.content}
        message: dict[str, Any] = {"role": "assistant", "content": c.reply.content}
        if c.reply.calls:
            message["tool_calls"] = [call.openai() for call in c.reply.calls]
        return message

    def chunk(self, choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.options.include_usage:
            body["usage"] = usage
        return f"data: {json.dumps(body)}\n\n"

    def opening(self, c: Choice) -> dict[str, Any]:
        """The first chunk entry of a streamed chat choice: OpenAI opens each with its role."""
        return {
            "index": c.index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }

    def delta(self, c: Choice) -> dict[str, Any] | None:
        """The stream chunk entry for what `c` has new since the last one (None when nothing is)."""
        text = c.tracker.take()
        ended = c.finish_reason is not None and c.tracker.done
        calls: list[Any] = []
        if c.tools is not None and c.tools.request.parse:
            text, calls = self._tool_delta(c, text, ended)
        new = c.visible[c.reported :] if self.options.logprobs and (text or ended) else []
        if not (text or new or ended):
            return None
        entry: dict[str, Any] = {"index": c.index, "logprobs": self.logprobs(c, new) if new else None}
        c.reported += len(new)
        if self.chat:
            entry["delta"] = {"content": text} if text else {}
            if calls:
                entry["delta"]["tool_calls"] = [{"index": i, **call.openai()} for i, call in enumerate(calls)]
        else:
            entry["text"] = text
        entry["finish_reason"] = c.finish_reason if ended else None
        if ended:
            entry["stop_reason"] = c.stop_reason
        return entry


    @staticmethod
    def _tool_delta(c: Choice, piece: str, ended: bool) -> tuple[str, list[Any]]:
        """(content to send now, calls to send now) of a streamed choice whose reply is parsed for calls: text
        goes out until a call may start (`chat_tools.streamable`); the rest waits for the end, where the
        reply is either calls (sent whole) or, malformed or none, text."""
        c.seen += piece
        if not ended:
            safe = streamable(c.seen, c.tools.format) if c.tools is not None else len(c.seen)
            out = c.seen[c.released : safe] if safe > c.released else ""
            c.released = max(c.released, safe)
            return out, []
        assert c.reply is not None
        content = c.reply.content or ""
        out, c.released = content[c.released :], len(content)
        return out, list(c.reply.calls)


def _seen(changed: asyncio.Queue[Choice], c: Choice, _task: object) -> None:
    changed.put_nowait(c)


async def stream_events(
    server: TokenServer, completion: Completion, sampling: Sequence[SamplingParams]
) -> AsyncIterator[str]:
    """The server-sent events of a streamed completion: a chunk whenever a choice has new text (or ends),
    a usage chunk when asked for, then `data: [DONE]`. A client that goes away cancels the generation."""
    changed: asyncio.Queue[Choice] = asyncio.Queue()
    for c in completion.choices:
        c.on_change = changed.put_nowait
    tasks = {
        c: asyncio.create_task(c.run(server, sp)) for c, sp in zip(completion.choices, sampling, strict=True)
    }
    for c, task in tasks.items():
        task.add_done_callback(functools.partial(_seen, changed, c))  # a failed choice is seen too
    try:
        if completion.chat:
            yield completion.chunk([completion.opening(c) for c in completion.choices])
        finished: set[int] = set()
        while len(finished) < len(completion.choices):
            c = await changed.get()
            if c.index in finished:  # its last chunk is out; this is its task ending
                continue
            task = tasks[c]
            if task.done() and task.exception() is not None:
                err = task.exception()
                if not isinstance(err, APIError):  # a server fault: the status line has gone out already
                    log.error("a streamed choice failed", exc_info=err)
                    err = APIError(f"{type(err).__name__}: {err}", status_code=500, kind="server_error")
                yield f"data: {json.dumps(err.body())}\n\n"
                break
            entry = completion.delta(c)
            if entry is not None:
                yield completion.chunk([entry])
                if entry["finish_reason"] is not None:
                    finished.add(c.index)
        else:
            if completion.options.include_usage:
                yield completion.chunk([], completion.usage())
        yield "data: [DONE]\n\n"
    finally:
        for task in tasks.values():
            task.cancel()


# --------------------------------------------------------------------------- routes


def model_card(server: TokenServer) -> dict[str, Any]:
    return {
        "id": server.served_model_name,
        "object": "model",
        "created": int(server.started),
        "owned_by": "asearch",
        "root": server.model_path,
        "max_model_len": getattr(server.engine, "max_seq_len", None),
    }


async def complete(
    server: TokenServer, body: dict[str, Any], *, chat: bool
) -> JSONResponse | StreamingResponse:
    """Answer one `/v1/chat/completions` (chat) or `/v1/completions` request body. A server with
    `accept_any_model` (a training session) answers whatever `model` a request names; `max_choices` caps n.
    The body is validated first (`openai_requests.parse_request`): a bad field is a 400 naming it."""
    req = parse_request(body, chat=chat)
    if not getattr(server, "accept_any_model", False):
        check_model(req.model, server.served_model_name)
    tokenizer = getattr(server.engine, "tokenizer", None)
    if tokenizer is None:
        raise APIError("this server's engine has no tokenizer: OpenAI requests need one")
    options = request_options(req)
    if options.n > getattr(server, "max_choices", MAX_CHOICES):
        raise APIError(f"n={options.n}: this server answers at most {server.max_choices} choice(s)", param="n")  # type: ignore[attr-defined]
    if isinstance(req, ChatCompletionRequest):
        tools = chat_tools(tokenizer, req, server.served_model_name)
        prompts = [chat_prompt(tokenizer, req, server.served_model_name, tools)]
    else:
        tools, prompts = None, completion_prompts(tokenizer, req)
    for ids in prompts:
        check_prompt(ids, server.engine, "messages" if chat else "prompt")
    context = getattr(server.engine, "max_seq_len", 2048)
    choices, sampling = [], []
    for p, ids in enumerate(prompts):
        sp = sampling_params(req, eos_token_ids=server.eos_token_ids, max_new_default=context - len(ids))
        for j in range(options.n):  # choices of one prompt differ: each gets its own seed (seed + j)
            sampling.append(sp if sp.seed is None else dataclasses.replace(sp, seed=sp.seed + j))
            tracker = TextTracker(tokenizer, sp.stop, skip_special_tokens=options.skip_special_tokens)
            choices.append(Choice(p * options.n + j, ids, tracker, frozenset(sp.stop_token_ids), tools=tools))
    completion = Completion(
        chat, server.served_model_name, options, tokenizer, choices, sum(map(len, prompts))
    )
    if options.stream:
        return StreamingResponse(stream_events(server, completion, sampling), media_type="text/event-stream")
    await run_choices(server, choices, sampling)
    return JSONResponse(completion.response())


def mount_openai_api(app: FastAPI, server: TokenServer) -> None:
    """Add `/v1/chat/completions`, `/v1/completions`, `/v1/models` and `/v1/models/{name}` to `app`
    (errors are `APIError`s: the app answers them in OpenAI's shape)."""

    async def answer(request: Request, *, chat: bool) -> JSONResponse | StreamingResponse:
        try:
            return await complete(server, await json_body(request), chat=chat)
        except APIError:
            raise
        except Exception as e:  # noqa: BLE001 - a server fault, still answered in OpenAI's shape
            log.exception("%s failed", request.url.path)
            raise APIError(f"{type(e).__name__}: {e}", status_code=500, kind="server_error") from e

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> JSONResponse | StreamingResponse:
        return await answer(request, chat=True)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> JSONResponse | StreamingResponse:
        return await answer(request, chat=False)

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card(server)]})

    @app.get("/v1/models/{name:path}")
    async def model(name: str) -> JSONResponse:
        check_model(name, server.served_model_name)
        return JSONResponse(model_card(server))
