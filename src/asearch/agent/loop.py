"""The agent loop: alternate LLM turns and tool calls for one question until an answer or a limit.

Reads top to bottom: pick the turn kind (act, or read a pending result block) -> build the prompt ->
generate -> parse -> run the tool -> queue its blocks for reading. Every token the model saw is
recorded exactly as sent (no re-tokenisation between turns), with loss mask, log-probs and versions.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import Field, model_validator

from asearch.agent.parsing import ANSWER, Action, action_tags, parse_action
from asearch.agent.styles import AgentStyle, get_style
from asearch.agent.trajectory import Segment, Trajectory, Turn
from asearch.config import Config
from asearch.engine.types import (
    ChatTokenizer,
    Engine,
    GenerateRequest,
    GenerateResponse,
    SamplingParams,
    Tokenizer,
)
from asearch.tools import EpisodeContext, Tool, run_tool, tool_counter

_TRAILING_SPECIAL = re.compile(r"(?:\s*<\|[^|<>]{1,40}\|>)+\s*$")  # end-of-turn tokens like <|im_end|>


class AgentConfig(Config):
    """Limits and sampling for one episode."""

    style: str = Field(
        "asearcher",
        description="asearcher | reasoning | guided | search-r1 (docs/agent.md). `ask` and `eval` give small "
        "instruct models guided unless a style is set.",
    )
    style_options: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of the style's fields."
    )
    max_turns: int = Field(
        32, ge=1, description="LLM calls per episode, reading turns included (128+ works)."
    )
    max_context_tokens: int = Field(
        32768, ge=16, description="Prompt + new tokens of one call (also capped by the engine's max_seq_len); "
        "beyond it: finish. ASearcher works with 28-32k-token contexts (docs/agent.md).",
    )
    max_new_tokens: int = Field(512, ge=1, description="New tokens per LLM call.")
    temperature: float = Field(1.0, ge=0.0, description="0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 = disabled.")
    tool_timeout_s: float = Field(60.0, gt=0, description="A slower tool call becomes an error observation.")
    stop_repeats: int | None = Field(
        None, ge=2, description="End the episode (finish `repeated`) once the same tool call (action and "
        "argument) has returned the same result this many times in a row: a model re-issuing a call that can "
        "only answer the same thing is stuck, and its remaining turns would be spent for nothing. None: never.",
    )

    @model_validator(mode="after")
    def _style_exists(self) -> AgentConfig:
        self.resolved_style()  # raise early on an unknown style or option
        return self

    def resolved_style(self) -> AgentStyle:
        base = get_style(self.style)
        return (
            AgentStyle.model_validate({**base.model_dump(), **self.style_options})
            if self.style_options
            else base
        )


async def run_episode(
    engine: Engine,
    tokenizer: Tokenizer,
    tools: Mapping[str, Tool],
    question: str,
    cfg: AgentConfig,
    *,
    trajectory_id: str | None = None,
    seed: int | None = None,
    metadata: dict[str, Any] | None = None,
    on_turn: Callable[[Turn], None] | None = None,
) -> Trajectory:
    """Run one search episode. Never raises for model or tool mistakes: they are counted in the record.

    `on_turn` sees each turn once it is complete (its tool result included), e.g. for a live view.
    """
    episode = _Episode(engine, tokenizer, tools, question, cfg, trajectory_id=trajectory_id, seed=seed)
    episode.traj.metadata.update(metadata or {})
    return await episode.run(on_turn)


@dataclass(frozen=True, slots=True)
class _TurnPlan:
    """What the next LLM call is: its kind, the actions it may take, the context added right before it
    (`suffix`, which ends with `prefix`, the text the loop opens an act turn with) and its stop strings."""

    kind: Literal["act", "read"]
    allowed: tuple[str, ...]
    suffix: str
    prefix: str
    stop: list[str]


def turn_seed(episode_seed: int, turn: int) -> int:
    """The sampling seed of one turn: distinct per turn, and within 63 bits (servers take a signed int64)."""
    return (episode_seed * 1_000_003 + turn) % 2**63


class _Episode:
    """One episode in progress: the trajectory being recorded, its token context, the result blocks
    waiting for a reading turn, and the tools' state for this episode (`EpisodeContext`)."""

    def __init__(
        self,
        engine: Engine,
        tokenizer: Tokenizer,
        tools: Mapping[str, Tool],
        question: str,
        cfg: AgentConfig,
        *,
        trajectory_id: str | None,
        seed: int | None,
    ):
        self.engine, self.tools, self.cfg, self.seed = engine, tools, cfg, seed
        self.style = style = cfg.resolved_style()
        self.actions = style.allowed_actions(tools)
        self.tags = action_tags(tools)
        for tag in self.actions:  # a style may name an action without its tool (a tool error when used)
            self.tags.setdefault(tag, "argument")
        traj_id = trajectory_id or uuid.uuid4().hex
        self.traj = Trajectory(id=traj_id, question=question, style=style.name, action_tags=list(self.tags))
        self.ctx = _Context(style, tokenizer, question, self.traj, style.render_system_prompt(tools))
        self.stop_ids = _stop_token_ids(tokenizer)
        self.tool_state = EpisodeContext()
        self.pending_blocks: list[str] = []  # tool output waiting for a reading turn each
        self.actions_done = 0
        self.last_call: tuple[str, str, str] | None = None  # (action, argument, result) of the last tool call
        self.call_repeats = 0  # how many times in a row `last_call` came back the same

    async def run(self, on_turn: Callable[[Turn], None] | None) -> Trajectory:
        """Turn after turn until an answer or a limit; then the totals."""
        traj, t_start, shown = self.traj, time.perf_counter(), 0
        while True:
            shown = _report_turns(traj, on_turn, shown)
            if traj.num_turns >= self.cfg.max_turns:
                traj.finish = "max_turns"
                break
            if not await self._step():
                break
        _report_turns(traj, on_turn, shown)
        traj.counters["llm_calls"] = traj.num_turns
        traj.counters["generated_tokens"] = traj.generated_tokens
        traj.wall_s = time.perf_counter() - t_start
        return traj

    async def _step(self) -> bool:
        """One LLM call and what follows it: plan -> generate -> (summary | parse -> answer | tool).
        False when the episode is over."""
        plan = self._plan_turn()
        turn = await self._generate(plan)
        if turn is None:
            return False
        if plan.kind == "read":  # a reading turn only leaves its summary behind
            self.traj.count("read_turns")
            self.ctx.note(self.style.read_open + turn.output_text)
            self.ctx.compact_last_block()
            return True
        action = self._parse(turn, plan)
        if action is None:
            return True
        if action.kind == ANSWER:
            self.traj.answer = action.argument
            self.traj.finish = "answer"
            return False
        if await self._call_tool(turn, action):  # a tool that ends the episode, like synthesis's stop
            self.traj.answer, self.traj.finish = action.argument, "answer"
            return False
        if self.cfg.stop_repeats is not None and self._count_repeat(turn) >= self.cfg.stop_repeats:
            self.traj.finish = "repeated"
            return False
        return True

    def _count_repeat(self, turn: Turn) -> int:
        """How many times in a row this tool call (action, argument and result) has now been made."""
        call = (turn.action or "", turn.argument or "", turn.observation or "")
        self.call_repeats = self.call_repeats + 1 if call == self.last_call else 1
        self.last_call = call
        return self.call_repeats

    def _plan_turn(self) -> _TurnPlan:
        """A pending result block makes a reading turn; otherwise an act turn, which may only answer once
        `force_answer_after` tool actions are done."""
        style = self.style
        if self.pending_blocks:
            block = style.observation_template.format(text=self.pending_blocks.pop(0))
            suffix = self.ctx.as_user_turn(block) + style.read_open
            return _TurnPlan("read", (), suffix, "", [style.read_close])
        forced = style.force_answer_after is not None and self.actions_done >= style.force_answer_after
        allowed = (ANSWER,) if forced else self.actions
        prefix = ""
        if style.act_prefixes:
            prefix = style.act_prefixes[min(self.actions_done, len(style.act_prefixes) - 1)]
        suffix = (style.force_answer_note if forced else "") + prefix
        return _TurnPlan("act", allowed, suffix, prefix, [f"</{a}>" for a in allowed])

    async def _generate(self, plan: _TurnPlan) -> Turn | None:
        """Generate under the context budget and record the turn; None when the episode ends here (no room
        left, or the engine aborted)."""
        style, cfg, traj = self.style, self.cfg, self.traj
        prompt_ids = self.ctx.begin_call(plan.suffix, compactable=plan.kind == "read")
        turn_budget = (
            style.read_max_new_tokens if plan.kind == "read" else style.act_max_new_tokens or cfg.max_new_tokens
        )
        engine_limit = getattr(self.engine, "max_seq_len", None) or cfg.max_context_tokens
        context_limit = min(cfg.max_context_tokens, engine_limit)
        if len(prompt_ids) + turn_budget > context_limit and self.ctx.compact_summarised():
            prompt_ids = list(traj.segments[-1].token_ids)
        budget = min(turn_budget, context_limit - len(prompt_ids))
        if budget < 1:
            traj.finish = "max_tokens"
            return None
        sampling = SamplingParams(
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            top_k=cfg.top_k,
            max_new_tokens=budget,
            stop=plan.stop,
            stop_token_ids=self.stop_ids,
            seed=None if self.seed is None else turn_seed(self.seed, traj.num_turns),
        )
        t0 = time.perf_counter()
        resp = await self.engine.generate(
            GenerateRequest(input_ids=prompt_ids, sampling=sampling, trajectory_id=traj.id)
        )
        turn = Turn(
            kind=plan.kind,
            output_text=plan.prefix + self.ctx.end_call(resp),  # as the model sees it: with the loop's opening
            stop_reason=resp.stop_reason,
            prompt_tokens=len(prompt_ids),
            output_tokens=resp.output_len,
            versions=(min(resp.output_versions, default=-1), max(resp.output_versions, default=-1)),
            llm_latency_s=time.perf_counter() - t0,
            segment=len(traj.segments) - 1,
        )
        traj.turns.append(turn)
        if resp.stop_reason == "abort":
            traj.finish = "abort"
            return None
        if resp.stop_reason == "length" and resp.output_len == 0:  # the engine had no room left
            traj.finish = "max_tokens"
            return None
        return turn

    def _parse(self, turn: Turn, plan: _TurnPlan) -> Action | None:
        """The act turn's action; a malformed turn gets a correction (and None), never a crash."""
        text = turn.output_text
        opened = plan.prefix[1:-1] if plan.prefix.startswith("<") and plan.prefix.endswith(">") else None
        if self.style.close_opened_actions and opened in plan.allowed and f"</{opened}>" not in text:
            text = _TRAILING_SPECIAL.sub("", text).rstrip() + f"</{opened}>"
            turn.output_text = text
            self.traj.count("auto_closed")
        action = parse_action(text, plan.allowed, self.tags)
        turn.action, turn.argument = action.kind, action.argument or None
        if action.error:
            turn.parse_error = action.error
            self.traj.count("parse_errors")
            turn.observation = self.style.correction_template.format(error=action.error)
            self.ctx.observe(self.ctx.as_user_turn(turn.observation))
            return None
        return action

    async def _call_tool(self, turn: Turn, action: Action) -> bool:
        """Run the action's tool; its result is read block by block (or shown at once). True when the tool
        ends the episode (`metadata["ends_episode"]`): its argument then stands as the episode's answer."""
        kind, argument = action.kind or "", action.argument
        self.actions_done += 1
        tool = self.tools.get(kind)
        self.traj.count(tool_counter(tool) if tool is not None else kind)
        self.ctx.note(f"<{kind}>{argument}</{kind}>")
        ends = False
        if tool is None:
            turn.tool_error = f"tool {kind!r} is not configured for this agent"
            obs_text, blocks = turn.tool_error, None
        else:
            t1 = time.perf_counter()
            obs = await run_tool(tool, argument, timeout_s=self.cfg.tool_timeout_s, episode=self.tool_state)
            turn.tool_latency_s = time.perf_counter() - t1
            turn.tool_error = obs.error
            obs_text, blocks = obs.text, obs.metadata.get("chunks")
            ends = bool(obs.metadata.get("ends_episode"))
            if obs.metadata.get("fault") == "infrastructure":  # not the model's doing: the episode gets masked
                self.traj.count_infra_fault(obs.metadata["error"])
        if turn.tool_error:
            self.traj.count("tool_errors")
        turn.observation = obs_text
        reads = self.style.reading_tools is None or kind in self.style.reading_tools
        if self.style.reading_turns and reads and turn.tool_error is None:
            self.pending_blocks.extend(blocks or [obs_text])
        else:
            self.ctx.observe(self.ctx.as_user_turn(self.style.observation_template.format(text=obs_text)))
        return ends


def _report_turns(traj: Trajectory, on_turn: Callable[[Turn], None] | None, shown: int) -> int:
    """Hand the turns completed since the last report to `on_turn`; returns how many are reported."""
    if on_turn is not None:
        for turn in traj.turns[shown:]:
            on_turn(turn)
        return len(traj.turns)
    return shown


_ENCODE_CACHE: OrderedDict[tuple[int, str], tuple[int, ...]] = OrderedDict()
_ENCODE_CACHE_SIZE = 8192


def _encode_cached(tokenizer: Tokenizer, text: str) -> list[int]:
    """Tokenize context text, remembering recent results: the samples of a group (and later turns) see
    the same results and wrappers again, and tokenizing a search result costs ~0.5 ms on one core."""
    key = (id(tokenizer), text)
    ids = _ENCODE_CACHE.get(key)
    if ids is None:
        ids = tuple(tokenizer.encode(text, add_special_tokens=False))
        _ENCODE_CACHE[key] = ids
        if len(_ENCODE_CACHE) > _ENCODE_CACHE_SIZE:
            _ENCODE_CACHE.popitem(last=False)
    else:
        _ENCODE_CACHE.move_to_end(key)
    return list(ids)


def _stop_token_ids(tokenizer: Tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    convert = getattr(tokenizer, "convert_tokens_to_ids", None)
    unk = getattr(tokenizer, "unk_token_id", None)
    if convert is not None:
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = convert(tok)
            if isinstance(tid, int) and tid != unk:
                ids.add(tid)
    return sorted(ids)


class _Context:
    """The token-exact context of one trajectory under its style's history policy.

    full: one growing segment; a new segment starts only when a read block is compacted.
    summaries: every call is its own segment, built from the opening plus the tail of the notes.
    """

    def __init__(
        self, style: AgentStyle, tokenizer: Tokenizer, question: str, traj: Trajectory, system_prompt: str
    ):
        self.style, self.tok, self.traj = style, tokenizer, traj
        user = style.user_template.format(question=question)
        self.opening_text = _render_opening(tokenizer, style, system_prompt, user)
        self.notes: list[str] = []
        # chat models: tool results go in a user turn, wrapped exactly as the chat template would
        self.user_turn = (
            _user_turn_wrappers(cast(ChatTokenizer, tokenizer))
            if _uses_chat(tokenizer, style) and style.history == "full"
            else None
        )
        self._last_output = ""
        # full history: pieces of context as (ids, compact_ids | None) to rebuild after compaction
        self.pieces: list[tuple[list[int], list[int] | None]] = []
        self._last_block: int | None = None  # the block the current reading turn summarises
        self._summarised: list[int] = []  # blocks summarised and not yet cut (compact_when="full")
        if style.history == "full":
            opening = self._encode(self.opening_text)
            traj.segments.append(Segment())
            traj.segments[-1].extend_context(opening)
            self.pieces.append((opening, None))

    def _encode(self, text: str) -> list[int]:
        return _encode_cached(self.tok, text) if text else []

    def begin_call(self, suffix: str, *, compactable: bool) -> list[int]:
        if self.style.history == "summaries":
            notes = "".join(self.notes)[-self.style.history_chars :]
            body = self.opening_text + (f"Notes so far:\n{notes}\n" if notes else "") + suffix
            seg = Segment()
            seg.extend_context(self._encode(body))
            self.traj.segments.append(seg)
            return list(seg.token_ids)
        if suffix:
            ids = self._encode(suffix)
            compact = None
            if compactable and self.style.compact_read_blocks is not None:
                compact = self._encode(
                    suffix[: self.style.compact_read_blocks] + " ...\n" + self.style.read_open
                )
                self._last_block = len(self.pieces)
            self.traj.segments[-1].extend_context(ids)
            self.pieces.append((ids, compact))
        return list(self.traj.segments[-1].token_ids)

    def end_call(self, resp: GenerateResponse) -> str:
        self.traj.segments[-1].extend_generated(resp.output_ids, resp.output_logprobs, resp.output_versions)
        if self.style.history == "full":
            self.pieces.append((resp.output_ids, None))
        if self.user_turn is not None:  # only the tail matters: did the model already close its turn?
            self._last_output = self.tok.decode(resp.output_ids[-4:], skip_special_tokens=False)
        return resp.text or self.tok.decode(resp.output_ids, skip_special_tokens=True)

    def as_user_turn(self, text: str) -> str:
        """Chat models: close the assistant turn (unless the model already did), then a user turn with
        `text`, then open the next assistant turn. Raw-text styles: `text` unchanged."""
        if self.user_turn is None:
            return text
        close, reopen = self.user_turn
        done = next((k for k in range(len(close), 0, -1) if self._last_output.endswith(close[:k])), 0)
        return close[done:] + text.strip("\n") + reopen

    def observe(self, text: str) -> None:
        """Show the model something it did not write (tool result, correction)."""
        if self.style.history == "summaries":
            self.notes.append(text)
            return
        ids = self._encode(text)
        self.traj.segments[-1].extend_context(ids)
        self.pieces.append((ids, None))

    def note(self, text: str) -> None:
        if self.style.history == "summaries":
            self.notes.append(text + "\n")

    def compact_last_block(self) -> None:
        """The block just summarised may be cut: now (compact_when="read": the model continues in a new
        segment), or once the context is full (`compact_summarised`)."""
        if self._last_block is None:
            return
        self._summarised.append(self._last_block)
        self._last_block = None
        if self.style.compact_when == "read":
            self.compact_summarised()

    def compact_summarised(self) -> bool:
        """Replace every summarised block by its short form and go on in a new segment; False if none."""
        if not self._summarised:
            return False
        for i in self._summarised:
            ids, compact = self.pieces[i]
            self.pieces[i] = (compact or ids, None)
        self._summarised = []
        seg = Segment()
        seg.extend_context([t for piece, _ in self.pieces for t in piece])
        self.traj.segments.append(seg)
        self.traj.count("compactions")
        return True


def _uses_chat(tokenizer: Tokenizer, style: AgentStyle) -> bool:
    return bool(style.use_chat_template and getattr(tokenizer, "chat_template", None))


def _user_turn_wrappers(tokenizer: ChatTokenizer) -> tuple[str, str]:
    """(end of an assistant turn up to a user message's text, end of that user message up to the next
    assistant turn), read off the tokenizer's own chat template so any chat model is wrapped right."""
    a, u = "\x00ASSISTANT\x00", "\x00USER\x00"
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": a},
        {"role": "user", "content": u},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    i, j = text.index(a) + len(a), text.index(u)
    return text[i:j], text[j + len(u) :]


def _render_opening(tokenizer: Tokenizer, style: AgentStyle, system_prompt: str, user: str) -> str:
    """System + first user message, in the tokenizer's chat template when it has one."""
    if _uses_chat(tokenizer, style):
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": user}]
        return cast(ChatTokenizer, tokenizer).apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return f"{system_prompt}\n\n{user}\n"
