"""A training session per episode: an OpenAI endpoint over the policy engine that records every token.

    agent(client, item) ── client.chat.completions.create(...) ──> /sessions/{id}/v1/chat/completions
        -> `engine.server.openai_api.complete` (chat template, tools, parsing) -> EpisodeSession.run -> engine.generate
        -> the call recorded token in, token out: prompt ids, the sampled ids, their log-probs and versions

Each episode gets its own `EpisodeSession` and an `openai.AsyncOpenAI` pointed at its URL on a
`SessionRouter`: an ASGI app reached in process through httpx's ASGI transport (no socket, no port), or
served on a loopback port (`serve_loopback`) for agents whose HTTP stack is not httpx (any client given
`client.base_url` reaches the session).
Every completion is recorded into the episode's `Trajectory` exactly as the engine produced it. A call whose
prompt extends a segment recorded so far (the previous call's prompt + completion) continues it; any other
prompt (a chat template that re-renders history differently, a rewritten context, a parallel branch) starts a
new segment and is counted in `prompt_mismatches`: nothing is ever trained on re-tokenised text.

The session, not the agent, sets the sampling that RL needs: temperature, top-p and top-k are the workflow's
(`agent.*`; the trainer's log-probs assume them), the per-call seed follows the episode's seed, the completion
budget is at most `agent.max_new_tokens`, and an episode gets at most `agent.max_turns` completions within
`agent.max_context_tokens`. Tools the agent runs through asearch (`call_tool`) are counted in the same
trajectory, and their infrastructure faults mask the episode as the built-in agent's do.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from asearch.agent.loop import AgentConfig, turn_seed
from asearch.agent.trajectory import Segment, Trajectory, Turn
from asearch.engine.chat_tools import ParsedReply
from asearch.engine.server.openai_api import APIError, complete, json_body
from asearch.engine.types import Engine, GenerateRequest, GenerateResponse, SamplingParams, Tokenizer
from asearch.tools import EpisodeContext, Tool, run_tool, tool_counter

SESSION_HOST = "http://asearch-session"  # the in-process router's base URL (never resolved: ASGI transport)
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>")  # end-of-turn tokens of chat templates


class EngineAborted(APIError):
    """The engine cut a completion off (it is closing, or the episode was cancelled): the episode is rejected."""


@dataclass(slots=True)
class _SessionEngine:
    """What the OpenAI routes read of an engine: its tokenizer and context length (the episode's budget)."""

    tokenizer: Tokenizer
    max_seq_len: int


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's EOS and the end-of-turn tokens it knows: a completion ends at any of them."""
    ids = {tokenizer.eos_token_id} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    unk = getattr(tokenizer, "unk_token_id", None)
    for tok in STOP_TOKENS:
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != unk:
            ids.add(tid)
    return sorted(ids)


class EpisodeSession:
    """One episode's OpenAI server (`openai_api.TokenServer`) over the policy engine, recording into `traj`."""

    accept_any_model = True  # an agent written for another server names its model: the policy answers
    max_choices = 1  # n > 1 would record sibling completions of one prompt as a mismatch each

    def __init__(
        self, engine: Engine, tokenizer: Tokenizer, traj: Trajectory, cfg: AgentConfig, *, seed: int | None = None,
        served_model_name: str = "policy", split_calls: bool = False,
    ):  # fmt: skip
        """`split_calls`: every completion its own segment (its prompt and its tokens), e.g. to weigh turns apart."""
        self.policy, self.traj, self.cfg, self.seed, self.split_calls = engine, traj, cfg, seed, split_calls
        context = min(cfg.max_context_tokens, getattr(engine, "max_seq_len", None) or cfg.max_context_tokens)
        self.engine = _SessionEngine(tokenizer, context)
        self.model_path = self.served_model_name = served_model_name
        self.eos_token_ids = stop_token_ids(tokenizer)
        self.started = time.time()
        self.counts: dict[str, int] = {}  # the OpenAI routes count tool calls and malformed ones here
        self.aborted = False
        self.context_exceeded = False
        self.calls_refused = 0  # completions asked for beyond agent.max_turns

    def sampling(self, requested: SamplingParams, call: int) -> SamplingParams:
        """The request's stops and budget, with the workflow's temperature, top-p, top-k and seed."""
        cfg = self.cfg
        return dataclasses.replace(
            requested, temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
            max_new_tokens=min(requested.max_new_tokens, cfg.max_new_tokens),
            stop_token_ids=sorted({*requested.stop_token_ids, *self.eos_token_ids}),
            seed=None if self.seed is None else turn_seed(self.seed, call),
        )  # fmt: skip

    async def run(
        self, ids: list[int], sampling: SamplingParams, *, rid: str = "", on_token: Any = None
    ) -> tuple[GenerateResponse, str]:
        """Generate one completion on the policy engine and record it (`on_token` is not used: a streamed
        choice gets its tokens when the completion ends)."""
        if self.traj.num_turns >= self.cfg.max_turns:
            self.calls_refused += 1
            raise APIError(
                f"this episode has made its {self.cfg.max_turns} completions (agent.max_turns)", code="max_turns"
            )
        t0 = time.perf_counter()
        request = GenerateRequest(input_ids=list(ids), sampling=self.sampling(sampling, self.traj.num_turns), trajectory_id=self.traj.id)
        resp = await self.policy.generate(request)
        self.record(list(ids), resp, time.perf_counter() - t0)
        if resp.stop_reason == "abort":
            self.aborted = True
            raise EngineAborted("the engine aborted this completion", status_code=503, kind="server_error")
        return resp, str(self.policy.version)

    def record(self, prompt: list[int], resp: GenerateResponse, latency_s: float) -> None:
        """Add one completion to the trajectory: in the segment its prompt extends, else in a new segment."""
        traj = self.traj
        k = next((i for i in reversed(range(len(traj.segments))) if _extends(prompt, traj.segments[i].token_ids)), None)
        if k is None and traj.segments:
            traj.count("prompt_mismatches")
        if k is None or self.split_calls:
            traj.segments.append(Segment())
            k = len(traj.segments) - 1
        segment = traj.segments[k]
        segment.extend_context(prompt[len(segment) :])
        segment.extend_generated(list(resp.output_ids), list(resp.output_logprobs), list(resp.output_versions))
        tok = self.engine.tokenizer
        traj.turns.append(Turn(
            kind="act", output_text=tok.decode(resp.output_ids, skip_special_tokens=True), stop_reason=resp.stop_reason,
            prompt_tokens=len(prompt), output_tokens=resp.output_len, llm_latency_s=latency_s, segment=k,
            versions=(min(resp.output_versions, default=-1), max(resp.output_versions, default=-1)),
        ))  # fmt: skip

    def on_reply(self, reply: ParsedReply) -> None:
        """The routes' parse of the last completion: its first call names the turn's action; a malformed call
        is the turn's parse error (the reward's format gate sees it, as it sees the built-in agent's)."""
        if not self.traj.turns:
            return
        turn = self.traj.turns[-1]
        if reply.malformed:
            turn.parse_error = f"malformed tool call: {reply.malformed}"
            self.traj.count("parse_errors")  # the built-in agent's counter (rollout/parse_errors, eval's column)
        elif reply.calls:
            turn.action, turn.argument = reply.calls[0].name, reply.calls[0].arguments

    def finish_counters(self) -> None:
        """The session's counts in the trajectory's counters (what the built-in agent's loop records)."""
        traj = self.traj
        for key, n in self.counts.items():
            traj.count(key, n)
        traj.counters["llm_calls"] = traj.num_turns
        traj.counters["generated_tokens"] = traj.generated_tokens


def _extends(prompt: list[int], tokens: list[int]) -> bool:
    return len(prompt) >= len(tokens) and prompt[: len(tokens)] == tokens


class SessionRouter:
    """The OpenAI endpoints of every open session, at `/sessions/{id}/v1/...` of one ASGI app."""

    def __init__(self) -> None:
        self.sessions: dict[str, EpisodeSession] = {}
        self.app = self._build_app()
        self.root = SESSION_HOST  # a loopback server's http://127.0.0.1:PORT once `serve_loopback` started it
        self._loopback: tuple[Any, Any, asyncio.Task[None]] | None = None  # (event loop, uvicorn server, its task)

    async def serve_loopback(self) -> str:
        """Serve the sessions on a free loopback port in this event loop (again in a new loop); the base URL.
        The server runs until the loop ends or `stop_loopback`."""
        import uvicorn

        from asearch.net import free_port

        loop = asyncio.get_running_loop()
        if self._loopback is not None and self._loopback[0] is loop and not self._loopback[2].done():
            return self.root
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        task = loop.create_task(server._serve())  # serve() minus its signal capture: Ctrl-C stays the run's
        while not server.started:
            if task.done():
                task.result()  # the server failed to start: raise why
                raise RuntimeError(f"the session server on port {port} stopped before it started")
            await asyncio.sleep(0.01)
        self._loopback, self.root = (loop, server, task), f"http://127.0.0.1:{port}"
        return self.root

    async def stop_loopback(self) -> None:
        if self._loopback is not None:
            _, server, task = self._loopback
            server.should_exit = True
            await task
            self._loopback, self.root = None, SESSION_HOST

    def open(self, session: EpisodeSession) -> str:
        sid = uuid.uuid4().hex
        self.sessions[sid] = session
        return sid

    def close(self, sid: str) -> None:
        self.sessions.pop(sid, None)

    def base_url(self, sid: str) -> str:
        return f"{self.root}/sessions/{sid}/v1"

    def client(self, sid: str) -> Any:
        """An `openai.AsyncOpenAI` for session `sid`, served in process or on the loopback server once it runs
        (close it with `await client.close()`)."""
        import httpx

        try:
            import openai
        except ImportError as e:  # an optional dependency: only agents written against it need it
            raise ImportError("workflow kind openai_agent needs the openai client: pip install 'asearch[openai]'") from e
        if self._loopback is not None:
            return openai.AsyncOpenAI(base_url=self.base_url(sid), api_key="asearch-session", max_retries=0, timeout=None)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), timeout=None)
        return openai.AsyncOpenAI(  # the installed openai annotates http_client with its own httpx fork's class
            base_url=self.base_url(sid), api_key="asearch-session", http_client=http, max_retries=0  # type: ignore[arg-type]
        )

    def _session(self, sid: str) -> EpisodeSession:
        session = self.sessions.get(sid)
        if session is None:
            raise APIError(f"no open session {sid!r} (its episode has ended)", status_code=404, code="session_not_found")
        return session

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="asearch training sessions (OpenAI API)")

        @app.exception_handler(APIError)
        async def _error(_request: Request, err: APIError) -> JSONResponse:
            return JSONResponse(err.body(), status_code=err.status_code)

        @app.post("/sessions/{sid}/v1/chat/completions", response_model=None)
        async def chat(sid: str, request: Request) -> JSONResponse | StreamingResponse:
            session = self._session(sid)
            try:
                return await complete(session, await json_body(request), chat=True)
            except APIError as e:
                session.context_exceeded |= e.code == "context_length_exceeded"
                raise

        @app.get("/sessions/{sid}/v1/models")
        async def models(sid: str) -> JSONResponse:
            session = self._session(sid)
            card = {"id": session.served_model_name, "object": "model", "created": int(session.started), "owned_by": "asearch"}
            return JSONResponse({"object": "list", "data": [card]})

        return app


# --------------------------------------------------------------------------- asearch's tools inside an episode


@dataclass(slots=True)
class EpisodeTools:
    """The tools of the episode running in this task (the workflow's, for its item) and where calls are counted."""

    tools: Mapping[str, Tool]
    traj: Trajectory
    timeout_s: float
    state: EpisodeContext = dataclasses.field(default_factory=EpisodeContext)


CURRENT_TOOLS: contextvars.ContextVar[EpisodeTools | None] = contextvars.ContextVar("asearch_episode_tools", default=None)


def episode_tools() -> EpisodeTools | None:
    """The tools of the episode this agent runs in (None outside an asearch workflow)."""
    return CURRENT_TOOLS.get()


async def call_tool(name: str, argument: str) -> str:
    """Run asearch tool `name` (search, access, ...) of the current episode on `argument` and return the text
    the model should read. Counted in the episode's trajectory like the built-in agent's calls: calls by tool,
    tool errors, and infrastructure faults, which mask the episode out of training and accuracy."""
    current = CURRENT_TOOLS.get()
    if current is None:
        raise RuntimeError("call_tool runs inside an asearch episode (workflow kind openai_agent); build tools yourself outside one")
    tool = current.tools.get(name)
    if tool is None:
        current.traj.count("tool_errors")
        return f"tool {name!r} is not configured for this agent"
    current.traj.count(tool_counter(tool))
    obs = await run_tool(tool, argument, timeout_s=current.timeout_s, episode=current.state)
    if obs.error:
        current.traj.count("tool_errors")
    if obs.metadata.get("fault") == "infrastructure":
        current.traj.count_infra_fault(obs.metadata["error"])
    if current.traj.turns and current.traj.turns[-1].observation is None:
        current.traj.turns[-1].observation, current.traj.turns[-1].tool_error = obs.text, obs.error
    return obs.text
